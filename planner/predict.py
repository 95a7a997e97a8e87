"""Predicted speed of a plan from the simulator: the closed-form screen (fast, for searches and
sweeps) or the discrete-event simulation (for the plan that is finally chosen)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.screen import screen
from specs.hardware import HardwareSpec
from specs.model import ModelSpec
from specs.plan import Plan


@dataclass(frozen=True)
class Prediction:
    decode_tok_s: float
    ttft_s: float
    bottleneck: str
    prefill_tok_s: float = 0.0
    cache_hit_rate: float = 0.0
    method: str = "screen"

    def to_dict(self) -> dict:
        return asdict(self)


def predict(model: ModelSpec, hw: HardwareSpec, plan: Plan, prompt_tokens: int = 512) -> Prediction:
    """Steady-state decode tok/s and TTFT (s) of `plan` from the simulator's closed-form screen."""
    s = screen(model, hw, plan, prompt_tokens=prompt_tokens)
    decode_s = 1.0 / s.decode_tok_s if s.decode_tok_s else 0.0
    prefill_s = max(s.ttft_s - decode_s, 0.0)
    return Prediction(decode_tok_s=s.decode_tok_s, ttft_s=s.ttft_s, bottleneck=s.bottleneck,
                      prefill_tok_s=prompt_tokens / prefill_s if prefill_s > 0 else 0.0,
                      cache_hit_rate=s.hit_rate, method="screen")


def simulate_plan(model: ModelSpec, hw: HardwareSpec, plan: Plan, prompt_tokens: int = 512,
                  gen_tokens: int = 128, seed: int = 0) -> Prediction:
    """Decode tok/s and TTFT (s) of `plan` from the discrete-event simulation (with contention)."""
    from simulator.run import simulate

    r = simulate(model, hw, plan, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, seed=seed)
    return Prediction(decode_tok_s=r.decode_tok_s, ttft_s=r.ttft_s, bottleneck=r.bottleneck,
                      prefill_tok_s=r.prefill_tok_s, cache_hit_rate=r.cache_hit_rate,
                      method=f"event simulation, {gen_tokens} tokens")
