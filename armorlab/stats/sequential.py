"""Seeds until resolved: a group-sequential comparison of each arm with its baseline (Lan–DeMets spending,
repeated CIs, Holm over arms); method, references and the equations in full: docs/verdicts.md; error rates
measured by benchmarks/sequential_seeds.py. ``decide_look`` is called after each look.
    (G1) t = I / I_max, I = 1/(1/n_x + 1/n_y), I_max = n_max/2
    (G2) O'Brien–Fleming-type spending, α/2 a side: α(t) = 2·(2 − 2Φ(z_{1−α/4} / √t))
    (G3) Pocock-type spending: α(t) = α·ln(1 + (e − 1)·t)
    (G4) c_k: P₀(|Z_j| < c_j for j < k, |Z_k| ≥ c_k) = α(t_k) − α(t_{k−1}), Z_k√t_k Brownian motion
    (G5) reject when |d/se| ≥ t_ν⁻¹(1 − a_k/2), a_k = 2(1 − Φ(c_k)), ν Welch's
    (G6) repeated CI d ± t_ν⁻¹(1 − a_k/2)·se; equivalent when inside (−δ, δ)
    (G7) Holm: with r arms rejected, an arm is rejected at level α/(m − r)
    (G8) Pocock c_k = C_P(K, α); O'Brien–Fleming c_k = C_B(K, α)·√(K/k) (by G4 in tests/test_sequential.py)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from armorlab.core.lazy import Lazy
from armorlab.errors import ArmorLabError
from armorlab.stats import verdicts as V
from armorlab.stats.seeds import finite

GRID = 201                 # Simpson points per look on (−c, c), odd: boundaries agree to 1e-7 with 1601
SPENDING = ("obf", "pocock")
LOOKS_VERSION = 1
CONTINUE = "continue"
sp = Lazy("scipy.special", "scipy.optimize")  # the report never needs them


# --------------------------------------------------------------------------- spending and boundaries
def information_fraction(n_x: int, n_y: int, n_max: int) -> float:
    """(G1) t = (1/(1/n_x + 1/n_y)) / (n_max/2), at most 1."""
    if n_x < 1 or n_y < 1 or n_max < 1:
        return 0.0
    return min(1.0, (1.0 / (1.0 / n_x + 1.0 / n_y)) / (n_max / 2.0))


def spend(t: float, alpha: float, spending: str = "obf") -> float:
    """(G2) or (G3): the type I error spent by information fraction t ∈ [0, 1]."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == "obf":
        return float(2 * (2 - 2 * sp.ndtr(float(sp.ndtri(1 - alpha / 4)) / math.sqrt(t))))
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")


@dataclass
class _Walk:
    """The sub-density of Z_k on the continuation region, carried look by look (G4): the last look's grid
    and density × Simpson weight on it (before the first look, all mass at 0)."""
    drift: float = 0.0
    t: float = 0.0
    z: np.ndarray = field(default_factory=lambda: np.zeros(1))
    mass: np.ndarray = field(default_factory=lambda: np.ones(1))

    def _moments(self, t: float) -> tuple[np.ndarray, float]:
        """Mean of S(t) from each grid point of the last look, and the increment's sd."""
        return self.z * math.sqrt(self.t) + self.drift * (t - self.t), math.sqrt(t - self.t)

    def crossing(self, c: float, t: float) -> tuple[float, float]:
        """P(reach look k, Z_k ≥ c) and P(reach look k, Z_k ≤ −c)."""
        mu, s = self._moments(t)
        edge = c * math.sqrt(t)
        return float(self.mass @ sp.ndtr((mu - edge) / s)), float(self.mass @ sp.ndtr((-edge - mu) / s))

    def advance(self, c: float, t: float) -> None:
        """Carry the sub-density past look k with boundary c (an infinite c: nothing stops)."""
        mu, s = self._moments(t)
        c = c if math.isfinite(c) else 12.0  # nothing stops: the grid still covers the density
        z = np.linspace(-c, c, GRID)
        w = np.ones(GRID)
        w[1:-1:2], w[2:-1:2] = 4.0, 2.0   # Simpson's rule
        x = (z[:, None] * math.sqrt(t) - mu[None, :]) / s
        density = (np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)) @ self.mass * (math.sqrt(t) / s)
        self.z, self.mass, self.t = z, density * (w * (z[1] - z[0]) / 3.0), t


@functools.lru_cache(maxsize=8192)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    walk = _Walk()
    out, spent = [], 0.0
    for k, t in enumerate(fractions):
        target = (alpha if k == len(fractions) - 1 and t >= 1 else spend(t, alpha, spending)) - spent
        spent += max(target, 0.0)
        c = math.inf if target <= 1e-15 else float(sp.brentq(  # the c whose crossings spend the target
            lambda c, t=t, target=target: sum(walk.crossing(c, t)) - target, 0.0, 40.0, xtol=1e-10))
        out.append(c)
        walk.advance(c, t)
    return tuple(out)


def spending_boundaries(fractions: Sequence[float], alpha: float = V.ALPHA, spending: str = "obf"
                        ) -> tuple[float, ...]:
    """(G4) two-sided z boundaries at increasing information fractions in (0, 1]."""
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    f = tuple(float(x) for x in fractions)
    if not f or any(not (0 < x <= 1) for x in f) or any(b <= a for a, b in zip(f, f[1:], strict=False)):
        raise ValueError(f"information fractions must increase within (0, 1], got {f}")
    return _boundaries(f, float(alpha), spending)


def nominal_level(c: float) -> float:
    """(G5) the two-sided nominal level of a z boundary: 2(1 − Φ(c))."""
    return 0.0 if math.isinf(c) else float(2 * sp.ndtr(-c))


def t_boundary(c: float, df: float) -> float:
    """(G5) the |t| a statistic with ``df`` degrees of freedom must reach at nominal level of c."""
    a = nominal_level(c)
    return float(sp.stdtrit(df, 1 - a / 2)) if a > 0 else math.inf


# --------------------------------------------------------------------------- the design and a look
@dataclass(frozen=True)
class Design:
    """A sequential comparison fixed before its first look (fields: docs/verdicts.md)."""
    baseline: str
    arms: tuple[str, ...]
    endpoint: str = "final"
    delta: float = math.nan
    alpha: float = V.ALPHA
    spending: str = "obf"
    first_look: int = 3
    seeds_per_look: int = 2
    max_seeds: int = 10
    power: float = V.POWER
    higher_is_better: bool | None = None
    method: str = field(default="", compare=False)

    def __post_init__(self):
        checks = [("spending", self.spending in SPENDING, f"one of {', '.join(SPENDING)}"),
                  ("alpha", 0 < self.alpha < 1, "a number in (0, 1)"),
                  ("first_look", isinstance(self.first_look, int) and self.first_look >= 2, "an integer ≥ 2"),
                  ("seeds_per_look", isinstance(self.seeds_per_look, int) and self.seeds_per_look >= 1,
                   "an integer ≥ 1"),
                  ("max_seeds", isinstance(self.max_seeds, int) and self.max_seeds >= self.first_look,
                   f"an integer ≥ first_look ({self.first_look})"),
                  ("power", 0 < self.power < 1, "a number in (0, 1)"),
                  ("arms", bool(self.arms) and self.baseline not in self.arms, "arms other than the baseline"),
                  ("delta", math.isnan(self.delta) or self.delta > 0, "a number > 0 (or unset)")]
        for key, ok, want in checks:
            if not ok:
                raise ArmorLabError(f"must be {want}", key=key, value=getattr(self, key))
        if self.higher_is_better is None:
            object.__setattr__(self, "higher_is_better", self.endpoint not in V.LOWER_IS_BETTER)
        object.__setattr__(self, "arms", tuple(self.arms))
        if not self.method:
            object.__setattr__(self, "method", METHOD[self.spending])

    def schedule(self) -> list[int]:
        """Seeds per arm at each look: first_look, then + seeds_per_look, capped at max_seeds."""
        out = [self.first_look]
        while out[-1] < self.max_seeds:
            out.append(min(out[-1] + self.seeds_per_look, self.max_seeds))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arms": list(self.arms), "delta": None if math.isnan(self.delta) else self.delta}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Design:
        if unknown := [k for k in d if k not in cls.__dataclass_fields__]:
            raise ArmorLabError(f"unknown design key (known: {', '.join(sorted(cls.__dataclass_fields__))})",
                                key=unknown[0], value=d[unknown[0]])
        d = {**d, "arms": tuple(d.get("arms") or ())}
        try:
            d["delta"] = math.nan if d.get("delta") is None else float(d["delta"])
            return cls(**d)
        except ArmorLabError:
            raise
        except (TypeError, ValueError) as exc:
            raise ArmorLabError(f"malformed design ({exc})", key="design", value=dict(d)) from None


METHOD = {s: (f"group-sequential Welch t-test, Lan–DeMets {name}-type alpha spending, repeated "
              f"confidence intervals, Holm over arms")
          for s, name in (("obf", "O'Brien–Fleming"), ("pocock", "Pocock"))}


def _history(looks: Sequence[Mapping[str, Any]], arm: str) -> tuple[list[float], dict | None]:
    """The information fractions at which ``arm`` was tested, and its resolving comparison."""
    mine = [c for look in looks for c in look.get("comparisons", ()) if c.get("arm") == arm]
    done = next((dict(c) for c in reversed(mine) if c.get("verdict") != CONTINUE), None)
    return [float(c["fraction"]) for c in mine if c.get("tested")], done


def decide_look(design: Design, values: Mapping[str, Sequence[float]],
                looks: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """(G1–G7) the decision after one look, the JSON record appended to looks.json; an arm resolved
    earlier keeps its verdict; ``next`` maps each arm that goes on to its seeds at the next look."""
    if missing := [a for a in (design.baseline, *design.arms) if a not in values]:
        raise ArmorLabError("no values for this arm at the look", key="values", value=missing[0])
    m = len(design.arms)
    xs = {a: finite(values[a]) for a in (design.baseline, *design.arms)}
    base = xs[design.baseline]
    state = {a: _history(looks, a) for a in design.arms}
    rejected_before = sum(1 for _, done in state.values() if done and done["verdict"] in (V.BETTER, V.WORSE))
    comps, pending = {}, {}  # arm → its comparison; arm → (Welch, fractions) of the arms tested now
    for a in design.arms:
        fractions, done = state[a]
        if done is not None:
            comps[a] = {**done, "tested": False, "carried": True}
            continue
        x = xs[a]
        w = V.welch(x, base)
        final = len(x) >= design.max_seeds and len(base) >= design.max_seeds
        t = 1.0 if final else information_fraction(len(x), len(base), design.max_seeds)
        grew = not fractions or t > fractions[-1]
        comps[a] = {"arm": a, "baseline": design.baseline, "n": [len(x), len(base)], "diff": w.diff,
                    "se": w.se, "df": w.df, "fraction": t, "final": final,
                    "tested": bool(grew and math.isfinite(w.se)), "verdict": CONTINUE}
        if comps[a]["tested"]:
            pending[a] = (w, [*fractions, t])
    rejected: dict[str, float] = {}
    while True:  # (G7) Holm's step-down over repeated p-values: boundaries at α/(m − r)
        rest = design.alpha / max(m - rejected_before - len(rejected), 1)
        if not (new := {a: rest for a, (w, f) in pending.items()
                        if a not in rejected and _crosses(w, f, rest, design.spending)}):
            break
        rejected |= new
    for a, (w, f) in pending.items():
        level = rejected.get(a, rest)
        c = spending_boundaries(f, level, design.spending)[-1]
        tb = t_boundary(c, w.df) if w.se > 0 else 0.0
        lo, hi = w.diff - tb * w.se, w.diff + tb * w.se
        verdict, inside = V.classify(w.diff, lo, hi, a in rejected, design.delta, design.higher_is_better)
        if verdict == V.UNRESOLVED and not comps[a]["final"]:
            verdict = CONTINUE
        comps[a].update(level=level, z_bound=c, t_bound=tb, t=w.diff / w.se if w.se > 0 else math.copysign(
            math.inf, w.diff), ci=[lo, hi], verdict=verdict, within_delta=inside)
        if verdict == V.UNRESOLVED:
            comps[a]["seeds_needed"] = V.seeds_for_power(design.delta, w.pooled_sd, design.alpha / m,
                                                         design.power)
    going = [a for a in design.arms if comps[a]["verdict"] == CONTINUE]
    nxt = {a: _next_size(xs[a].size, design) for a in going}
    if going:
        nxt[design.baseline] = max(_next_size(len(base), design), max(nxt.values()))
    return {"look": len(looks) + 1,
            "seeds": {a: x.size for a, x in xs.items()},
            "stats": {a: {"n": int(x.size), "mean": float(x.mean()) if x.size else None,
                          "sd": float(x.std(ddof=1)) if x.size > 1 else None, "values": [float(v) for v in x]}
                      for a, x in xs.items()},
            "comparisons": [_jsonable(comps[a]) for a in design.arms],
            "next": nxt, "done": not going}


def _next_size(n: int, design: Design) -> int:
    return next((s for s in design.schedule() if s > n), design.max_seeds)


def _crosses(w: V.Welch, fractions: list[float], level: float, spending: str) -> bool:
    if w.se == 0:
        return w.diff != 0
    return abs(w.diff) / w.se >= t_boundary(spending_boundaries(fractions, level, spending)[-1], w.df)


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    """NaN and ±inf as null (JSON has neither)."""
    def fix(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return [fix(x) for x in v] if isinstance(v, list) else v
    return {k: fix(v) for k, v in d.items()}


def latest_comparisons(looks: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each arm's comparison at the last look, as a report shows it."""
    return {c["arm"]: dict(c) for c in looks[-1].get("comparisons", ())} if looks else {}


# --------------------------------------------------------------------------- looks.json
def looks_record(design: Design, looks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What looks.json holds: ``{"version", "method", "design", "looks": [...]}``."""
    return {"version": LOOKS_VERSION, "method": design.method, "design": design.as_dict(), "looks": list(looks)}


def read_looks_record(record: Mapping[str, Any], *, file: str | None = None) -> tuple[Design, list[dict]]:
    """The design and looks of a looks.json mapping; ArmorLabError naming the key when malformed."""
    if not isinstance(record, Mapping):
        raise ArmorLabError("looks.json must hold a mapping", key="<root>", value=type(record).__name__, file=file)
    if record.get("version") != LOOKS_VERSION:
        raise ArmorLabError(f"unsupported looks.json version (this armorlab reads {LOOKS_VERSION})",
                            key="version", value=record.get("version"), file=file)
    design_raw = record.get("design")
    if not isinstance(design_raw, Mapping):
        raise ArmorLabError("must be a mapping", key="design", value=design_raw, file=file)
    try:
        design = Design.from_dict(design_raw)
    except ArmorLabError as exc:
        raise ArmorLabError(f"bad design: {exc}", key="design", value=dict(design_raw), file=file) from None
    looks = record.get("looks")
    if not isinstance(looks, list) or not all(isinstance(x, Mapping) and isinstance(x.get("comparisons"), list)
                                             for x in looks):
        raise ArmorLabError("must be a list of look records with comparisons", key="looks", value=looks, file=file)
    return design, [dict(x) for x in looks]
