"""Canary rollout: route a fraction of a name's traffic to a candidate version and judge it on episodes.

This module knows nothing of torch or of our model: a :class:`Target` is a version label and the
upstream ``model`` string that serves it (a slot of :class:`~agentrl_train.serve.engine.Engine`, or a
LoRA name on a vLLM server), so the same :class:`Router` sits in front of any OpenAI-compatible server.

Routing is sticky per conversation: the ``x-episode-id`` (or ``x-conversation-id``) header is hashed
(HMAC-SHA-256 under a key drawn per router, so a client cannot pick ids that land on the candidate) to
a number in [0, 1) and compared with the fraction, so one episode stays on one version; requests
without an id are drawn from the router's seeded generator.

Episodes and verdicts: every routed request belongs to an episode (its conversation id, or the request
alone), and :meth:`Router.open_episode` issues the episode a *feedback id* (random, 128 bits) bound to
the credential that asked. An outcome (``POST /v1/feedback``) names that id, comes from the same
credential, and is taken once: a second verdict for an episode is refused, an id never issued (or
forgotten past :data:`MAX_TRACKED_EPISODES`) is unknown. So the rules count episodes that were served,
never posts.

Judging: per version the router counts requests, errors, replies whose tool call parsed, latency, and
the outcomes agents report (success, api_error_rate, timeout_rate). Once both the candidate and the
baseline have :attr:`CanaryRules.min_episodes` episodes *since the canary started*, the rules are
applied (when :attr:`CanaryRules.auto`): every one holds -> promote, any fails -> roll back. Every
decision is logged with its numbers and kept in :attr:`Deployment.decisions`.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = [
    "CanaryRules",
    "Decision",
    "Deployment",
    "EpisodeJudgedError",
    "Router",
    "Target",
    "VersionStats",
    "sticky_unit",
]

MAX_TRACKED_EPISODES = 100_000


class EpisodeJudgedError(ConfigError):
    """An episode's outcome was already reported: one verdict per episode."""


@dataclass
class _Episode:
    label: str  #: the version that served its last request
    credential: str  #: a digest of the credential that opened it
    conversation: str | None
    judged: bool = False


@dataclass(frozen=True)
class CanaryRules:
    """When a candidate is promoted or rolled back (rates are fractions in [0, 1])."""

    min_episodes: int = 20
    """Episodes both the candidate and the baseline need (since the canary started) before a decision."""
    success_margin: float = 0.05
    """Promote only if candidate success rate >= baseline - this."""
    timeout_margin: float = 0.05
    """... and candidate timeout rate <= baseline + this."""
    api_error_margin: float = 0.05
    """... and candidate API error rate <= baseline + this."""
    parse_margin: float = 0.10
    """... and candidate tool-call parse rate (per request) >= baseline - this."""
    error_margin: float = 0.02
    """... and candidate request error rate <= baseline + this."""
    auto: bool = True
    """Apply the rules after every episode report; False leaves it to ``POST .../promote|rollback``."""

    def __post_init__(self) -> None:
        if not isinstance(self.min_episodes, int) or isinstance(self.min_episodes, bool) or self.min_episodes < 1:
            raise ConfigError(f"min_episodes={self.min_episodes!r}: use an int >= 1")
        for name in ("success_margin", "timeout_margin", "api_error_margin", "parse_margin", "error_margin"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ConfigError(f"{name}={value!r}: use a number in [0, 1]")


@dataclass
class VersionStats:
    """What one version did (since it was loaded, or since the canary started for the judged window)."""

    requests: int = 0
    errors: int = 0
    tool_calls_parsed: int = 0
    latency_s_sum: float = 0.0
    latency_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=2048))
    episodes: int = 0
    successes: int = 0
    api_error_rate_sum: float = 0.0
    timeout_rate_sum: float = 0.0

    def rates(self) -> dict[str, float]:
        n, e = max(self.requests, 1), max(self.episodes, 1)
        lat = sorted(self.latency_s)
        return {
            "requests": self.requests,
            "episodes": self.episodes,
            "success_rate": self.successes / e,
            "api_error_rate": self.api_error_rate_sum / e,
            "timeout_rate": self.timeout_rate_sum / e,
            "parse_rate": self.tool_calls_parsed / n,
            "error_rate": self.errors / n,
            "latency_p50_s": lat[len(lat) // 2] if lat else 0.0,
        }


@dataclass(frozen=True)
class Target:
    """One servable version, and the server's one record of it: ``name@version`` is what responses carry;
    ``model`` is what the upstream is asked (a local :class:`~agentrl_train.serve.engine.Engine`'s slot, or
    an upstream's model name). The deployment holds it; requests, loads and decisions read it from there."""

    name: str
    version: int
    model: str
    path: str | None = None  #: where it was loaded from (server side; never shown to clients)
    source: str | None = None  #: what ``GET /v1/adapters/NAME`` shows instead of the path

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Decision:
    """A promotion or rollback, with the numbers it was made on."""

    name: str
    action: str  #: "promote" or "rollback"
    reason: str  #: which rules held or failed, or "manual"
    candidate: str
    baseline: str
    numbers: dict[str, dict[str, float]]
    at: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Deployment:
    """One served name: its stable version, an optional candidate, and their numbers."""

    stable: Target
    canary: Target | None = None
    fraction: float = 0.0
    next_version: int = 2
    stats: dict[str, VersionStats] = field(default_factory=dict)  #: label -> lifetime numbers
    window: dict[str, VersionStats] = field(default_factory=dict)  #: label -> numbers since the canary started
    decisions: list[Decision] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "stable": self.stable.label,
            "stable_source": self.stable.source,
            "canary": self.canary.label if self.canary else None,
            "canary_source": self.canary.source if self.canary else None,
            "fraction": self.fraction,
            "versions": {k: v.rates() for k, v in self.stats.items()},
            "window": {k: v.rates() for k, v in self.window.items()},
            "decisions": [d.as_dict() for d in self.decisions[-20:]],
        }


def sticky_unit(conversation_id: str, key: bytes = b"") -> float:
    """A conversation id hashed to [0, 1) under ``key``: the same id always lands on the same side of a fraction."""
    digest = hmac.new(key, conversation_id.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_fraction(fraction: Any) -> float:
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"fraction={fraction!r}: use a number in [0, 1], e.g. 0.05 for 5% of the traffic")
    return float(fraction)


class Router:
    """Chooses a version per request, keeps per-version numbers and applies the canary rules.

    Args:
        rules: when to promote or roll back.
        on_decision: called with each decision (the server frees the losing slot there).
        seed: seeds the draw for requests that carry no conversation id.
        log: where decisions are reported.
    """

    def __init__(
        self,
        rules: CanaryRules | None = None,
        *,
        on_decision: Callable[[Deployment, Decision, Target], None] | None = None,
        seed: int = 0,
        log: Callable[[str], None] = print,
    ) -> None:
        self.rules = rules or CanaryRules()
        self.deployments: dict[str, Deployment] = {}
        self.on_decision = on_decision
        self.log = log
        self._rng = random.Random(seed)
        self._key = secrets.token_bytes(16)  # sticky hashing: ids that land on the candidate cannot be chosen offline
        self._episodes: collections.OrderedDict[str, _Episode] = collections.OrderedDict()  # feedback id -> episode
        self._open: dict[tuple[str, str], str] = {}  # (credential, conversation id) -> feedback id

    # -- set-up ----------------------------------------------------------------------------------

    def add(self, target: Target) -> None:
        dep = Deployment(stable=target, next_version=target.version + 1)
        dep.stats[target.label] = VersionStats()
        self.deployments[target.name] = dep

    def remove(self, name: str) -> Deployment:
        """Stop serving ``name`` (``/v1/unload_lora_adapter``); its episodes' verdicts are refused from now on.

        Raises:
            KeyError: no such name.
        """
        return self.deployments.pop(name)

    def get(self, name: str) -> Deployment:
        dep = self.deployments.get(name)
        if dep is None:
            raise KeyError(name)
        return dep

    def replace_stable(self, name: str, model: str, path: str | None, source: str | None = None) -> Target:
        """A hot reload: the next version of ``name`` becomes stable (the caller has already swapped it in)."""
        dep = self.get(name)
        target = Target(name, dep.next_version, model, path, source)
        dep.next_version += 1
        dep.stable = target
        dep.stats[target.label] = VersionStats()
        if dep.canary is not None:
            dep.window[target.label] = VersionStats()
        self._trim(dep)
        return target

    def start_canary(self, name: str, model: str, path: str | None, fraction: float, source: str | None = None) -> Target:
        dep = self.get(name)
        if dep.canary is not None:
            raise ConfigError(
                f"{name} already has a canary ({dep.canary.label}); promote or roll it back first "
                f"(POST /v1/adapters/{name}/promote or /rollback)"
            )
        target = Target(name, dep.next_version, model, path, source)
        dep.next_version += 1
        dep.canary, dep.fraction = target, check_fraction(fraction)
        dep.stats[target.label] = VersionStats()
        dep.window = {dep.stable.label: VersionStats(), target.label: VersionStats()}
        self.log(f"serve: canary {target.label} ({path or model}) gets {dep.fraction:.1%} of {name}; baseline {dep.stable.label}")
        return target

    # -- requests --------------------------------------------------------------------------------

    def route(self, name: str, conversation_id: str | None) -> Target:
        dep = self.get(name)
        if dep.canary is None:
            target = dep.stable
        else:
            u = sticky_unit(conversation_id, self._key) if conversation_id else self._rng.random()
            target = dep.canary if u < dep.fraction else dep.stable
        return target

    def open_episode(self, target: Target, conversation_id: str | None, credential: str = "") -> str:
        """The feedback id of the episode ``target`` just served (the conversation's, or a new one).

        Args:
            target: the version routed to (the episode is judged on the last version that served it).
            conversation_id: the client's episode id; None makes the request an episode of its own.
            credential: a digest of the credential that asked; only it may report the outcome.
        """
        key = (credential, conversation_id) if conversation_id else None
        feedback_id = self._open.get(key) if key is not None else None
        episode = self._episodes.get(feedback_id) if feedback_id is not None else None
        if feedback_id is None or episode is None or episode.judged:  # a judged conversation id starts a new episode
            feedback_id = f"fb-{secrets.token_hex(16)}"
            episode = _Episode(target.label, credential, conversation_id)
            self._episodes[feedback_id] = episode
            if key is not None:
                self._open[key] = feedback_id
        episode.label = target.label
        self._episodes.move_to_end(feedback_id)
        while len(self._episodes) > MAX_TRACKED_EPISODES:
            _, old = self._episodes.popitem(last=False)
            if old.conversation is not None:
                self._open.pop((old.credential, old.conversation), None)
        return feedback_id

    def record(self, target: Target, *, ok: bool, parsed: bool, latency_s: float) -> None:
        dep = self.deployments.get(target.name)
        if dep is None:
            return
        for book in (dep.stats, dep.window):
            s = book.get(target.label)
            if s is None:
                continue
            s.requests += 1
            s.errors += not ok
            s.tool_calls_parsed += parsed
            s.latency_s_sum += latency_s
            s.latency_s.append(latency_s)

    def feedback(self, feedback_id: str, outcome: dict[str, Any], credential: str = "") -> str:
        """Attribute one episode's outcome to the version that served it; returns that version's label.

        Raises:
            KeyError: ``feedback_id`` was never issued to ``credential`` (or is too old to remember).
            EpisodeJudgedError: the episode's outcome was already reported.
        """
        episode = self._episodes.get(feedback_id)
        if episode is None or not hmac.compare_digest(episode.credential, credential):
            raise KeyError(feedback_id)
        if episode.label.rsplit("@", 1)[0] not in self.deployments:  # its name was unloaded since
            raise KeyError(feedback_id)
        if episode.judged:
            raise EpisodeJudgedError(
                f"feedback_id {feedback_id[:60]!r}: this episode's outcome was already reported; one verdict per episode"
            )
        episode.judged = True
        if episode.conversation is not None:
            self._open.pop((credential, episode.conversation), None)
        label = episode.label
        name = label.rsplit("@", 1)[0]
        dep = self.deployments[name]
        for book in (dep.stats, dep.window):
            s = book.get(label)
            if s is None:
                continue
            s.episodes += 1
            s.successes += bool(outcome["success"])
            s.api_error_rate_sum += float(outcome.get("api_error_rate", 0.0))
            s.timeout_rate_sum += float(outcome.get("timeout_rate", 0.0))
        if self.rules.auto and dep.canary is not None:
            self.judge(name)
        return label

    # -- decisions -------------------------------------------------------------------------------

    def judge(self, name: str) -> Decision | None:
        """Apply the rules to ``name``'s canary; None while either side has too few episodes."""
        dep = self.get(name)
        if dep.canary is None:
            return None
        cand = dep.window[dep.canary.label].rates()
        base = dep.window[dep.stable.label].rates()
        r = self.rules
        if cand["episodes"] < r.min_episodes or base["episodes"] < r.min_episodes:
            return None
        checks = {
            "success": cand["success_rate"] >= base["success_rate"] - r.success_margin,
            "timeout": cand["timeout_rate"] <= base["timeout_rate"] + r.timeout_margin,
            "api_error": cand["api_error_rate"] <= base["api_error_rate"] + r.api_error_margin,
            "parse": cand["parse_rate"] >= base["parse_rate"] - r.parse_margin,
            "errors": cand["error_rate"] <= base["error_rate"] + r.error_margin,
        }
        failed = [k for k, ok in checks.items() if not ok]
        reason = ("failed: " + ", ".join(failed)) if failed else "all rules held"
        return self.decide(name, "rollback" if failed else "promote", reason)

    def decide(self, name: str, action: str, reason: str = "manual") -> Decision:
        """Promote the candidate to stable, or roll it back; logged with the window's numbers.

        Raises:
            ConfigError: ``name`` has no canary, or ``action`` is neither promote nor rollback.
        """
        dep = self.get(name)
        if dep.canary is None:
            raise ConfigError(f"{name} has no canary to {action}; start one with POST /v1/adapters/{name}/canary")
        if action not in ("promote", "rollback"):
            raise ConfigError(f"action={action!r}: use promote or rollback")
        cand, base = dep.canary, dep.stable
        numbers = {"candidate": dep.window[cand.label].rates(), "baseline": dep.window[base.label].rates()}
        decision = Decision(name, action, reason, cand.label, base.label, numbers, time.time())
        dep.decisions.append(decision)
        loser = base if action == "promote" else cand
        if action == "promote":
            dep.stable = cand
        dep.canary, dep.fraction, dep.window = None, 0.0, {}
        c, b = numbers["candidate"], numbers["baseline"]
        self.log(
            f"serve: {action} {cand.label} vs {base.label} ({reason}): episodes {c['episodes']}/{b['episodes']}, "
            f"success {c['success_rate']:.3f}/{b['success_rate']:.3f}, timeout {c['timeout_rate']:.3f}/{b['timeout_rate']:.3f}, "
            f"api errors {c['api_error_rate']:.3f}/{b['api_error_rate']:.3f}, parse {c['parse_rate']:.3f}/{b['parse_rate']:.3f}, "
            f"request errors {c['error_rate']:.3f}/{b['error_rate']:.3f}"
        )
        if self.on_decision is not None:
            self.on_decision(dep, decision, loser)
        self._trim(dep)
        return decision

    def _trim(self, dep: Deployment) -> None:
        """Keep lifetime numbers for the live versions and the last few others (memory stays flat)."""
        live = {dep.stable.label, *([dep.canary.label] if dep.canary else [])}
        old = [k for k in dep.stats if k not in live]
        for k in old[:-8]:
            del dep.stats[k]
