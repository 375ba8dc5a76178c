"""Prometheus metrics, one `CollectorRegistry` per app, names following vLLM's where they overlap.

Design decisions:
- Each `Metrics` owns its registry, so two apps in one process (tests) never share counters.
- Latencies are measured by the server from the request's arrival, queueing included: what a client
  sees, minus the network. Inter-token latency is observed per token: a chunk of n tokens that
  arrived dt after the previous one counts n observations of dt / n (drafting writes several tokens
  per forward, and that is the speed-up the histogram should show).
- Drafting counters come from the engine's `GenerationStats` once a request ends (cancelled ones
  included: their forwards were spent).
- The prefix cache's counters (`decode/prefix.py`) are read from it when the exposition is written
  (it counts on the scheduler thread); queries and hits are counted in tokens, as vLLM's
  `prefix_cache_queries` / `prefix_cache_hits`, so hits / queries is the share of prompt tokens not
  prefilled again. Absent when the cache is off.
- Labels follow vLLM's, so its dashboards' queries read ours: every sample carries `model_name` (the
  served model's name, added when the exposition is written: one place, every metric), and finished
  requests are counted by `finished_reason`.
- Every metric is also written under vLLM's naming, `yue:` for `vllm:` (`VLLM_NAMES`: vLLM's name where
  it has one, else `yue:` + ours), so a vLLM dashboard reads yue after one substitution. The copy is
  made when the exposition is written, from the same samples: the two names can never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from yue.batcher import BatchStep
from yue.decode.prefix import PrefixCache
from yue.decode.types import GenerationStats, StreamEvent

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

# Our family -> the vLLM-style names it is also written under (`vllm:` read as `yue:`), where vLLM's name
# is not simply ours with `yue:` for `yue_`. vLLM renamed a few over its versions: both names are kept.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    # vLLM v0's per-token histogram, and V1's name for it.
    "yue_inter_token_latency_seconds": (
        "yue:inter_token_latency_seconds",
        "yue:time_per_output_token_seconds",
    ),
    # vLLM's per-engine-step token count.
    "yue_step_tokens": ("yue:iteration_tokens_total",),
    # The prefix cache is yue's one shared K/V store (each request's own cache is preallocated).
    "yue_prefix_cache_usage_perc": ("yue:kv_cache_usage_perc", "yue:gpu_cache_usage_perc"),
}


def vllm_names(family: str) -> tuple[str, ...]:
    """The vLLM-style names a family is also exposed under (`yue_x` -> `yue:x` unless `VLLM_NAMES` says)."""
    return VLLM_NAMES.get(family, ("yue:" + family.removeprefix("yue_"),))


class Metrics:
    """All of the server's metrics, registered in a registry of their own."""

    def __init__(
        self, running: Callable[[], int], waiting: Callable[[], int], prefix_cache: PrefixCache | None = None
    ) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        if prefix_cache is not None:
            r.register(_PrefixCacheCollector(prefix_cache))
        self.model_name = ""  # set once the model has loaded (`ServerState.start`)
        self.ttft = Histogram(
            "yue_time_to_first_token_seconds", "Arrival to first token.", registry=r, buckets=_LATENCY_BUCKETS
        )
        self.itl = Histogram(
            "yue_inter_token_latency_seconds", "Time between tokens.", registry=r, buckets=_ITL_BUCKETS
        )
        self.e2e = Histogram(
            "yue_e2e_request_latency_seconds", "Arrival to last token.", registry=r, buckets=_LATENCY_BUCKETS
        )
        self.tpot = Histogram(
            "yue_request_time_per_output_token_seconds",
            "Per request: (last token - first token) / (tokens - 1).",
            registry=r,
            buckets=_ITL_BUCKETS,
        )
        self.request_prompt_tokens = Histogram(
            "yue_request_prompt_tokens",
            "Prompt tokens per finished request.",
            registry=r,
            buckets=_TOKEN_BUCKETS,
        )
        self.request_generation_tokens = Histogram(
            "yue_request_generation_tokens",
            "Generated tokens per finished request.",
            registry=r,
            buckets=_TOKEN_BUCKETS,
        )
        self.queue = Histogram(
            "yue_request_queue_time_seconds",
            "Time waiting to join the running batch.",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.prompt_tokens = Counter("yue_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("yue_generation_tokens", "Tokens generated.", registry=r)
        self.success = Counter(
            "yue_request_success", "Finished requests by finish reason.", ["finished_reason"], registry=r
        )
        self.failure = Counter("yue_request_failure", "Failed requests by reason.", ["reason"], registry=r)
        self.running = Gauge("yue_num_requests_running", "Requests generating now.", registry=r)
        self.running.set_function(running)
        self.waiting = Gauge("yue_num_requests_waiting", "Requests waiting to join the batch.", registry=r)
        self.waiting.set_function(waiting)
        self.num_drafts = Counter("yue_spec_decode_num_drafts", "Drafting steps.", registry=r)
        self.draft_tokens = Counter("yue_spec_decode_num_draft_tokens", "Draft tokens proposed.", registry=r)
        self.accepted_tokens = Counter(
            "yue_spec_decode_num_accepted_tokens", "Draft tokens kept.", registry=r
        )
        self.accepted_per_pos = Counter(
            "yue_spec_decode_num_accepted_tokens_per_pos",
            "Drafting steps whose draft token at this position was kept.",
            ["position"],
            registry=r,
        )
        self.by_source = Counter(
            "yue_generation_tokens_by_source",
            "Generated tokens by the source that wrote them (an accepted draft counts for its proposer).",
            ["source"],
            registry=r,
        )
        self.router = Counter(
            "yue_router_decisions", "Drafted block positions by the path chosen.", ["mode"], registry=r
        )
        self._add_step_metrics(r)

    def _add_step_metrics(self, r: CollectorRegistry) -> None:
        """Per decode step (continuous batching) and per prompt screened for personal data."""
        # How many requests each decode step served, what it wrote, how long it took.
        self.batch_size = Histogram(
            "yue_batch_size", "Requests stepped together per decode step.", registry=r, buckets=_BATCH_BUCKETS
        )
        self.step_tokens = Histogram(
            "yue_step_tokens",
            "Tokens written per decode step (all requests).",
            registry=r,
            buckets=_BATCH_BUCKETS,
        )
        self.step_time = Histogram(
            "yue_step_seconds", "Wall time of a decode step.", registry=r, buckets=_ITL_BUCKETS
        )
        # The steps' two phases apart (`loop.PhaseTimes`): prefill (prompt chunks, and each new request's
        # first step) and decode (the running requests' steps), tokens and scheduler-thread seconds, so
        # that each phase's tokens/s under load is a ratio of two counters' increases.
        self.prefill_tokens = Counter("yue_prefill_tokens", "Prompt tokens prefilled.", registry=r)
        self.prefill_seconds = Counter("yue_prefill_seconds", "Seconds spent prefilling.", registry=r)
        self.decode_tokens = Counter("yue_decode_tokens", "Tokens written by decode steps.", registry=r)
        self.decode_seconds = Counter("yue_decode_seconds", "Seconds spent in decode steps.", registry=r)
        self.pii = Histogram(
            "yue_pii_redaction_seconds",
            "Time to find and redact personal data in a prompt.",
            registry=r,
            buckets=_ITL_BUCKETS,
        )

    def step(self, report: BatchStep, seconds: float) -> None:
        """Book one decode step (called on the scheduler thread)."""
        self.batch_size.observe(report.rows)
        self.step_tokens.observe(report.tokens)
        self.step_time.observe(seconds)
        phases = report.phases
        self.prefill_tokens.inc(phases.prefill_tokens)
        self.prefill_seconds.inc(phases.prefill_s)
        self.decode_tokens.inc(phases.decode_tokens)
        self.decode_seconds.inc(phases.decode_s)

    def render(self) -> bytes:
        return generate_latest(_WithModelName(self.registry, self.model_name))

    def track(self, arrival: float) -> RequestTracker:
        return RequestTracker(self, arrival)


class RequestTracker:
    """Times one request from its arrival and books its outcome exactly once."""

    def __init__(self, metrics: Metrics, arrival: float) -> None:
        self.metrics = metrics
        self.arrival = arrival
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.tokens = 0
        self.done = False
        self.queue_booked = False

    def queued(self, seconds: float) -> None:
        """Book the time the request waited for a worker (once)."""
        if not self.queue_booked:
            self.queue_booked = True
            self.metrics.queue.observe(seconds)

    def on_event(self, event: StreamEvent) -> None:
        """Time a chunk and count its tokens; call it as each chunk arrives from the worker. Tokens are
        counted here, as they arrive, so a cancelled request counts what it generated whether it was
        streamed or not."""
        n = len(event.token_ids)
        if not n:
            return
        self.metrics.generation_tokens.inc(n)
        self.tokens += n
        now = time.perf_counter()
        if self.first_token is None:  # the first chunk has a TTFT, not an inter-token latency
            self.first_token = now
            self.metrics.ttft.observe(now - self.arrival)
        else:
            gap = (now - self.last_token) / n
            for _ in range(n):
                self.metrics.itl.observe(gap)
        self.last_token = now

    @property
    def ttft_s(self) -> float:
        return (self.first_token or time.perf_counter()) - self.arrival

    def finish(self, prompt_tokens: int, finish_reason: str, stats: GenerationStats | None) -> float:
        """Book a request that ran to its end; returns its end-to-end latency in seconds."""
        latency = time.perf_counter() - self.arrival
        if self.done:
            return latency
        self.done = True
        m = self.metrics
        if finish_reason == "cancelled":
            m.failure.labels(reason="cancelled").inc()
        else:
            m.success.labels(finished_reason=finish_reason).inc()
            m.e2e.observe(latency)
            m.request_prompt_tokens.observe(prompt_tokens)
            m.request_generation_tokens.observe(self.tokens)
            if self.tokens > 1:
                m.tpot.observe((self.last_token - self.first_token) / (self.tokens - 1))
        m.prompt_tokens.inc(prompt_tokens)
        if stats is not None:
            self._book_stats(stats)
        return latency

    def fail(self, reason: str) -> None:
        if not self.done:
            self.done = True
            self.metrics.failure.labels(reason=reason).inc()

    def _book_stats(self, stats: GenerationStats) -> None:
        m = self.metrics
        m.num_drafts.inc(len(stats.accept_lengths))
        m.draft_tokens.inc(stats.drafted)
        m.accepted_tokens.inc(stats.accepted)
        for pos, count in enumerate(stats.accepted_per_pos, start=1):
            m.accepted_per_pos.labels(position=str(pos)).inc(count)
        for source, count in stats.token_sources.items():
            m.by_source.labels(source=source).inc(count)
        for mode, count in stats.router_decisions.items():
            m.router.labels(mode=mode).inc(count)


class _PrefixCacheCollector:
    """The prefix cache's counters, read as the exposition is written."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache

    def collect(self):
        s, c = self.cache.stats, self.cache
        yield CounterMetricFamily(
            "yue_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.queried_tokens
        )
        yield CounterMetricFamily(
            "yue_prefix_cache_hits",
            "Prompt tokens found in the prefix cache (not prefilled again).",
            s.hit_tokens,
        )
        lookups = CounterMetricFamily(
            "yue_prefix_cache_lookups",
            "Requests looked up, by whether any chunk was found.",
            labels=["result"],
        )
        lookups.add_metric(["hit"], s.hits)
        lookups.add_metric(["miss"], s.misses)
        yield lookups
        yield CounterMetricFamily("yue_prefix_cache_evictions", "Chunks dropped for room.", s.evictions)
        yield CounterMetricFamily(
            "yue_prefix_cache_filled_tokens",
            "Tokens of finished answers prefilled into the cache while idle.",
            s.filled_tokens,
        )
        yield GaugeMetricFamily("yue_prefix_cache_usage_bytes", "Bytes the prefix cache holds.", c.bytes)
        yield GaugeMetricFamily("yue_prefix_cache_capacity_bytes", "The prefix cache's bound.", c.max_bytes)
        yield GaugeMetricFamily(
            "yue_prefix_cache_usage_perc", "Prefix cache usage: 1 means full.", c.bytes / max(c.max_bytes, 1)
        )


class _WithModelName:
    """A registry's metrics with `model_name` added to every sample, as vLLM labels its own, each family
    written under its own name and then under its vLLM-style names (`vllm_names`)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.registry, self.model_name = registry, model_name

    def collect(self):
        for family in self.registry.collect():
            for name in (family.name, *vllm_names(family.name)):
                out = Metric(name, family.documentation, family.type, family.unit)
                out.samples = [  # a sample's name is its family's plus a suffix (_total, _bucket, ...)
                    s._replace(
                        name=name + s.name[len(family.name) :],
                        labels={**s.labels, "model_name": self.model_name},
                    )
                    for s in family.samples
                ]
                yield out
