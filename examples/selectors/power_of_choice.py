"""Power-of-choice client selection (Cho, Wang and Joshi, 2020, "Client selection in federated
learning: convergence analysis and power-of-choice selection strategies"), as a hetsim plugin.

Each round: draw ``d`` candidates without replacement, with probability proportional to their
local data size, and keep the ``m`` (the round's count) with the highest local loss. The loss is
the one each candidate reported at its last participation (the paper's communication-free
variant, rpow-d); a client never heard from counts as the highest, so every client is tried. The
engine keeps those losses for it (``uses_history``). ``d = m`` is a (size-weighted) random draw;
a larger ``d`` biases towards clients the model fits worst.
"""
import numpy as np
from pydantic import Field

from engine import plugins


class PowerOfChoiceParams(plugins.SelectionParams):
    d: int | None = Field(None, ge=1, description="candidates drawn per round (default: twice the count)")


@plugins.register_selector("power_of_choice")
class PowerOfChoice(plugins.SelectionPolicy):
    """Of d candidates drawn by data size, the m with the highest last reported loss."""

    Params = PowerOfChoiceParams
    uses_history = True

    def select(self, view):
        pool = view.pool()
        d = min(len(pool), max(view.count, self.params.d or 2 * view.count))
        size = view.train_samples[pool].astype(np.float64)
        p = size / size.sum() if size.sum() > 0 else None
        candidates = view.rng.choice(pool, size=d, replace=False, p=p)
        loss = view.history.last_train_loss[candidates]
        loss = np.where(np.isnan(loss), np.inf, loss)  # never heard from: first
        keep = np.argsort(-loss, kind="stable")[:view.count]
        return plugins.Selection(candidates[keep], score=loss[keep], reason=f"highest last loss of {d} drawn")
