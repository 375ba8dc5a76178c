"""`docs/results.md` is generated: it is what `recipes/results_table.py` makes from the bench JSONs now,
so no figure in it was copied by hand, and "latest" follows the file names' order."""

from __future__ import annotations

from recipes import results_table as rt


def test_results_md_is_what_the_bench_jsons_generate():
    assert rt.OUT.read_text(encoding="utf-8") == rt.table(), "run: python -m recipes.results_table"


def test_a_later_session_run_or_mended_run_is_the_latest():
    names = [
        "quiet-s9-smol-int4-2026-12-05",
        "quiet-s8-smol-int4-b-2026-12-05",
        "bench-smol-bf16-mended-s16-2026-12-03",
        "bench-smol-bf16-s16-2026-12-03",
        "quiet-s9-smol-float32-b-2026-12-05",
        "quiet-s9-smol-float32-2026-12-05",
        "screen-int4-before-run2-2026-12-04",
        "screen-int4-after-2026-12-04",
    ]
    order = sorted(names, key=rt.run_order)
    assert order.index("bench-smol-bf16-s16-2026-12-03") < order.index(
        "bench-smol-bf16-mended-s16-2026-12-03"
    )
    assert order.index("quiet-s8-smol-int4-b-2026-12-05") < order.index("quiet-s9-smol-int4-2026-12-05")
    assert order.index("quiet-s9-smol-float32-2026-12-05") < order.index("quiet-s9-smol-float32-b-2026-12-05")
    assert order.index("screen-int4-before-run2-2026-12-04") < order.index("screen-int4-after-2026-12-04")


def test_every_row_is_a_held_out_run_of_a_named_model_with_its_json_linked():
    runs = rt.latest_runs()
    assert runs, "no bench run read"
    for (model, _, _), (path, doc) in runs.items():
        assert model in rt.MODELS and doc["prompt_sets"][0]["name"].endswith("_test")
        assert f"(results/{path.name})" in rt.OUT.read_text(encoding="utf-8")


def test_the_readme_figures_are_what_the_jsons_generate():
    text = rt.README.read_text(encoding="utf-8")
    assert rt.README_START in text and rt.README_END in text
    assert text == rt.readme_with_table(text), "run: python -m recipes.results_table"
    block = rt.readme_table()
    assert block.count("\n| ") >= 3, "the README's table has no rows"


def test_size_ratios_pair_each_repeat_within_the_run():
    entry = {"peers": {"yue": {"tok_s@1": [14.0, 12.0]}, "llamacpp": {"tok_s@1": [7.0, 8.0]}}}
    assert rt.speed_ratios(entry, 1) == [2.0, 1.5]
    assert rt._spread([2.0, 1.5]) == "1.75 (1.50-2.00)"
