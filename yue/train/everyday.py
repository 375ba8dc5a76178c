"""Everyday requests made from templates: the kind of thing people type into a chat box.

Why: yue-smol's drafts were trained on answers to standard-library questions and to requests the model
wrote itself (Magpie). On hand-written everyday requests they fare worse (teacher-forced tau 1.50
against 2.13 on model-written ones): people ask shorter, plainer things (a poem about X, a recipe for
Y, a word problem with numbers) than the model writes for itself. These templates cover those kinds of
request: writing, science, cooking, travel, history, health and home, money, arithmetic word problems
and beginner Python, each template over its own list of subjects. They were written from those
category names, not from any evaluation prompt, and `everyday_prompts` drops any text whose
`content_hash` is in `exclude` (the shipped evaluation sets').
"""

from __future__ import annotations

import random

from yue.train.selfinstruct import content_hash

NATURE = [
    "the sea",
    "autumn leaves",
    "a thunderstorm",
    "the first snow",
    "a mountain lake",
    "the desert at night",
    "a spring morning",
    "the moon",
    "a summer rain",
    "an old oak tree",
    "a river",
    "the stars",
    "fog",
    "a sunflower field",
    "the wind",
    "a quiet forest",
    "a sunrise",
    "a waterfall",
    "a hummingbird",
    "winter",
]
DAILY = [
    "a cup of coffee",
    "a rainy Monday",
    "my grandmother's kitchen",
    "a city bus",
    "a lost umbrella",
    "a first day at school",
    "a long train ride",
    "a birthday party",
    "moving to a new town",
    "a cat asleep in the sun",
    "an old bicycle",
    "a library",
    "a market on Saturday",
    "learning to swim",
    "a late-night phone call",
    "a garden in July",
    "a lighthouse keeper",
    "a retired teacher",
    "a dog who loves the beach",
    "a small bakery",
]
WRITING = [
    "Write a haiku about {nature}.",
    "Write a short poem about {nature}.",
    "Write a limerick about {daily}.",
    "Write a four-line poem about {daily}.",
    "Write a short story about {daily}.",
    "Write a very short story that begins with {daily}.",
    "Describe {nature} in three sentences.",
    "Write a paragraph describing {nature} for a children's book.",
    "Write a diary entry about {daily}.",
    "Give me three ideas for a story about {daily}.",
    "Write a song chorus about {nature}.",
    "Write a thank-you note to {person} for {gift}.",
    "Write a short email to {person} asking to {errand}.",
    "Write a birthday message for {person}.",
    "Write a polite email to {person} to cancel {event}.",
    "Write a product description for {product}.",
    "Write a slogan for {business}.",
    "Write a short speech for {event}.",
    "Suggest five names for {business}.",
    "Write a motivational message for someone starting {start}.",
]
PERSON = [
    "my neighbour",
    "my teacher",
    "a colleague",
    "my aunt",
    "an old friend",
    "my landlord",
    "my manager",
    "a customer",
    "my coach",
    "my brother",
]
GIFT = [
    "a book",
    "a lovely dinner",
    "helping me move",
    "a scarf",
    "their advice",
    "watering my plants",
    "a birthday card",
    "the flowers",
]
ERRAND = [
    "reschedule our meeting",
    "borrow a ladder",
    "review my report",
    "meet for lunch next week",
    "send the invoice again",
    "join a book club",
]
EVENT = [
    "a wedding",
    "a retirement party",
    "a school graduation",
    "our dinner on Friday",
    "a team meeting",
    "a charity run",
    "the opening of a library",
]
PRODUCT = [
    "a reusable water bottle",
    "a wool sweater",
    "a desk lamp",
    "a pair of running shoes",
    "a backpack",
    "a teapot",
    "noise-cancelling headphones",
    "a board game for families",
]
BUSINESS = [
    "a bakery",
    "a bike repair shop",
    "a dog-walking service",
    "a bookshop cafe",
    "a cleaning company",
    "a yoga studio",
    "a food truck",
    "a plant nursery",
]
START = ["a new job", "university", "a running plan", "learning a language", "a small business"]
SCIENCE_TOPIC = [
    "the sky is blue",
    "leaves change colour in autumn",
    "we have seasons",
    "ice floats on water",
    "the moon has phases",
    "we dream",
    "bread rises",
    "the ocean is salty",
    "rainbows form",
    "we yawn",
    "cats purr",
    "metal feels colder than wood",
    "onions make you cry",
    "the sea has tides",
    "birds migrate",
    "we get goosebumps",
    "thunder follows lightning",
    "volcanoes erupt",
    "planes can fly",
    "bees make honey",
]
SCIENCE_THING = [
    "photosynthesis",
    "gravity",
    "the water cycle",
    "an earthquake",
    "DNA",
    "a black hole",
    "electricity",
    "the immune system",
    "climate change",
    "evolution",
    "a vaccine",
    "the greenhouse effect",
    "sound",
    "magnetism",
    "an atom",
    "the heart",
    "digestion",
    "a solar eclipse",
    "friction",
    "a rainbow",
]
SCIENCE = [
    "Why {science_topic}?",
    "Explain why {science_topic}.",
    "Can you explain why {science_topic} to a child?",
    "What is {science_thing}?",
    "Explain {science_thing} in simple terms.",
    "How does {science_thing} work?",
    "Give me three fun facts about {science_thing}.",
    "Explain {science_thing} to a ten-year-old.",
    "What is the difference between {pair}?",
]
PAIR = [
    "weather and climate",
    "a virus and a bacterium",
    "speed and velocity",
    "a star and a planet",
    "mass and weight",
    "an alligator and a crocodile",
    "a comet and an asteroid",
    "baking soda and baking powder",
    "a frog and a toad",
    "an ocean and a sea",
    "a mushroom and a plant",
    "AC and DC current",
]
DISH = [
    "banana bread",
    "pancakes",
    "a tomato soup",
    "guacamole",
    "a vegetable curry",
    "scrambled eggs",
    "a lemon cake",
    "hummus",
    "a Greek salad",
    "chocolate chip cookies",
    "fried rice",
    "a mushroom risotto",
    "a simple pizza dough",
    "lentil soup",
    "roast chicken",
    "a fruit smoothie",
    "apple pie",
    "pesto",
    "French toast",
    "a stir-fry",
]
INGREDIENTS = [
    "rice, eggs and spinach",
    "potatoes, cheese and onions",
    "pasta, garlic and tomatoes",
    "chickpeas, lemon and parsley",
    "bread, butter and apples",
    "oats, bananas and honey",
    "chicken, peppers and rice",
    "beans, corn and tortillas",
]
COOKING = [
    "Give me a recipe for {dish}.",
    "How do I make {dish}?",
    "What do I need to make {dish}?",
    "Give me a simple recipe for {dish} for two people.",
    "What can I cook with {ingredients}?",
    "How long should I cook {food}?",
    "How do I store {food} so it stays fresh?",
    "Suggest a healthy breakfast I can make in ten minutes.",
    "What is a good side dish for {dish}?",
    "Give me tips for cooking {dish} for the first time.",
]
FOOD = ["rice", "pasta", "a boiled egg", "salmon", "broccoli", "potatoes", "bread", "fresh herbs", "avocados"]
PLACE = [
    "Japan",
    "Iceland",
    "Italy",
    "Peru",
    "Morocco",
    "Canada",
    "Portugal",
    "Vietnam",
    "Norway",
    "Kenya",
    "Scotland",
    "Mexico",
    "Greece",
    "New Zealand",
    "Thailand",
    "Egypt",
    "Ireland",
    "Chile",
    "Croatia",
    "India",
]
SEASON = ["in winter", "in summer", "in spring", "in autumn", "for a week", "for a weekend", "on a budget"]
TRAVEL = [
    "What should I pack for a trip to {place} {season}?",
    "Plan a three-day trip to {place}.",
    "What are the best things to see in {place}?",
    "Give me tips for travelling to {place} {season}.",
    "What food should I try in {place}?",
    "What is the weather like in {place} {season}?",
    "How can I save money when travelling to {place}?",
    "Suggest a day trip from the capital of {place}.",
    "What should I know before visiting {place}?",
]
HISTORY_PERSON = [
    "Cleopatra",
    "Julius Caesar",
    "Marie Curie",
    "Leonardo da Vinci",
    "Napoleon",
    "Genghis Khan",
    "Abraham Lincoln",
    "Queen Victoria",
    "Galileo",
    "Nelson Mandela",
    "Isaac Newton",
    "Joan of Arc",
    "Mahatma Gandhi",
    "Charles Darwin",
    "Ada Lovelace",
    "Alexander the Great",
    "Confucius",
    "Mozart",
]
HISTORY_EVENT = [
    "the French Revolution",
    "the fall of the Roman Empire",
    "the moon landing",
    "the Industrial Revolution",
    "the printing press",
    "the Renaissance",
    "the Cold War",
    "the building of the pyramids",
    "the Black Death",
    "the invention of the telephone",
    "the First World War",
    "the Silk Road",
    "the fall of the Berlin Wall",
    "the American Revolution",
    "the Viking age",
]
HISTORY = [
    "Who was {history_person}?",
    "Tell me about {history_person}.",
    "Why is {history_person} famous?",
    "What caused {history_event}?",
    "Summarize {history_event} in a few sentences.",
    "Why was {history_event} important?",
    "Explain {history_event} to a student.",
    "Give me five facts about {history_event}.",
]
LIFE_TOPIC = [
    "sleep better",
    "drink more water",
    "save money each month",
    "keep houseplants alive",
    "stay focused while studying",
    "start running",
    "clean a cast-iron pan",
    "get rid of fruit flies",
    "remove a coffee stain",
    "make friends in a new city",
    "prepare for a job interview",
    "stop procrastinating",
    "learn a new language",
    "organize my closet",
    "reduce stress at work",
    "wake up earlier",
    "keep my phone battery healthy",
    "write a good CV",
    "eat less sugar",
    "train a puppy",
    "grow tomatoes",
    "fix a squeaky door",
    "make a budget",
    "stretch after running",
]
LIFE = [
    "How can I {life}?",
    "Give me tips to {life}.",
    "What is the best way to {life}?",
    "I want to {life}. Where do I start?",
    "Give me five ways to {life}.",
    "What are some good habits for a healthy life?",
    "What is {concept}?",
    "Explain {concept} simply.",
]
CONCEPT = [
    "inflation",
    "compound interest",
    "a credit score",
    "a mortgage",
    "the stock market",
    "a budget",
    "an index fund",
    "taxes",
    "democracy",
    "a recession",
    "mindfulness",
    "a calorie",
    "cholesterol",
]
NAMES = ["Sam", "Maria", "Tom", "Aisha", "Leo", "Priya", "Ben", "Chen", "Emma", "Omar"]
ITEMS = ["apples", "pencils", "cookies", "stickers", "marbles", "books", "eggs", "cupcakes"]


def _word_problem(rng: random.Random) -> str:
    """An arithmetic word problem with fresh numbers."""
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(3, 40), rng.randint(2, 25), rng.randint(2, 9)
    price, speed, hours = rng.randint(2, 15), rng.randint(30, 90), rng.randint(2, 6)
    return rng.choice(
        [
            f"{name} has {a} {item} and gives {b} to {other}. How many {item} does {name} have left?",
            f"{name} buys {c} {item} at {price} dollars each. How much does {name} spend?",
            f"A train travels at {speed} km per hour for {hours} hours. How far does it go?",
            f"{name} has {a * c} {item} to share equally among {c} friends. How many does each friend get?",
            f"A shop sells {item} for {price} dollars. {name} pays with a {price * c + 10} dollar note for {c} of "
            f"them. How much change does {name} get?",
            f"{name} reads {b} pages a day. How many days will it take to read a {b * a} page book?",
            f"A rectangle is {a} cm long and {b} cm wide. What is its area and perimeter?",
            f"{name} saves {price} dollars a week. How much will {name} have after {a} weeks?",
            f"If {c} workers build a wall in {hours * c} hours, how long would one worker take?",
            f"What is {a}% of {b * 20}?",
            f"{name} is {a} years old and {other} is {b} years younger. How old is {other}?",
            f"A recipe needs {c} eggs for {hours} people. How many eggs are needed for {hours * 3} people?",
        ]
    )


PY_TASK = [
    "reverse a list",
    "read a text file line by line",
    "sort a dictionary by value",
    "remove duplicates from a list",
    "count the words in a string",
    "check if a number is prime",
    "merge two dictionaries",
    "get the current date",
    "convert a string to an integer",
    "find the largest number in a list",
    "write a for loop",
    "use a list comprehension",
    "handle an exception",
    "open a CSV file",
    "make a simple class",
    "generate a random number",
    "join a list of strings",
    "check if a string is a palindrome",
    "compute a factorial",
    "print the Fibonacci numbers",
]
PYTHON = [
    "How do I {py_task} in Python?",
    "Write a Python function to {py_task}.",
    "Show me how to {py_task} in Python with an example.",
    "What is the easiest way to {py_task} in Python?",
    "What is a {py_word} in Python?",
    "Explain Python's {py_word} to a beginner.",
]
PY_WORD = [
    "dictionary",
    "tuple",
    "lambda",
    "decorator",
    "generator",
    "virtual environment",
    "list comprehension",
    "module",
    "f-string",
    "class",
    "while loop",
    "set",
]
SLOTS = {
    "nature": NATURE,
    "daily": DAILY,
    "person": PERSON,
    "gift": GIFT,
    "errand": ERRAND,
    "event": EVENT,
    "product": PRODUCT,
    "business": BUSINESS,
    "start": START,
    "science_topic": SCIENCE_TOPIC,
    "science_thing": SCIENCE_THING,
    "pair": PAIR,
    "dish": DISH,
    "ingredients": INGREDIENTS,
    "food": FOOD,
    "place": PLACE,
    "season": SEASON,
    "history_person": HISTORY_PERSON,
    "history_event": HISTORY_EVENT,
    "life": LIFE_TOPIC,
    "concept": CONCEPT,
    "py_task": PY_TASK,
    "py_word": PY_WORD,
}
# category -> templates; None: the arithmetic word problems. Weights: how often each is drawn.
CATEGORIES: dict[str, tuple[list[str] | None, float]] = {
    "writing": (WRITING, 3.0),
    "science": (SCIENCE, 2.0),
    "cooking": (COOKING, 1.5),
    "travel": (TRAVEL, 1.5),
    "history": (HISTORY, 1.5),
    "life": (LIFE, 2.0),
    "maths": (None, 1.0),
    "python": (PYTHON, 1.0),
}


GIVE_UP_AFTER = 5000  # consecutive draws that made nothing new: the templates are spent


def _fill(template: str, rng: random.Random) -> str:
    return template.format(**{k: rng.choice(v) for k, v in SLOTS.items() if "{" + k + "}" in template})


def everyday_prompts(
    n: int, seed: int = 0, exclude: set[str] = frozenset(), strict: bool = True
) -> list[list[dict]]:
    """`n` distinct everyday requests as one-message chat conversations; texts whose `content_hash`
    is in `exclude` are dropped. If the templates cannot make `n` distinct requests: raises, or with
    `strict=False` returns the fewer they made."""
    rng = random.Random(seed)
    names = list(CATEGORIES)
    weights = [CATEGORIES[c][1] for c in names]
    seen, out, misses = set(exclude), [], 0
    while len(out) < n:
        if misses > GIVE_UP_AFTER:
            if not strict:
                return out
            raise ValueError(f"the templates made only {len(out)} distinct requests of the {n} asked for")
        templates = CATEGORIES[rng.choices(names, weights)[0]][0]
        text = _word_problem(rng) if templates is None else _fill(rng.choice(templates), rng)
        h = content_hash(text)
        if h in seen:
            misses += 1
            continue
        seen.add(h)
        misses = 0
        out.append([{"role": "user", "content": text}])
    return out
