"""The step model's 16-token grid on arrays: :meth:`perfcast.serving.step.StepModel.step_s_array`
and ``step_many`` price many steps at once as ``step_s`` prices one."""

from __future__ import annotations

import numpy as np

#: Context grid of the attention tables (tokens); between two grid points the time is linear.
GRID = 16


def on_row(row: list[float], context: float) -> float:
    """A row of grid points (``row[i]`` at context ``i · GRID``) at ``context``, linear between its
    neighbours: :meth:`StepModel._row`'s interpolation, and the fast-forward's and decode pass's."""
    i = int(context // GRID)
    f = context / GRID - i
    return row[i] + f * (row[i + 1] - row[i])


def on_grid(parts: list, part_ix, cols: tuple, context) -> np.ndarray:
    """``parts[part_ix].attention(*cols, c)`` interpolated on the 16-token grid of ``c`` as
    :meth:`StepModel._row` interpolates its rows; each distinct (part, cols, grid point) once."""
    i = (context // GRID).astype(np.int64)
    keys = [np.concatenate([k, k]) for k in (part_ix, *cols)] + [np.concatenate([i, i + 1])]
    dims = [int(k.max(initial=0)) + 1 for k in keys]
    unique, inverse = np.unique(np.ravel_multi_index(keys, dims), return_inverse=True)
    at = np.unravel_index(unique, dims)
    values = np.empty(len(unique))
    for j in np.unique(at[0]):
        m = at[0] == j
        args = [a[m].astype(float) for a in at[1:-1]] + [at[-1][m] * float(GRID)]
        values[m] = np.broadcast_to(parts[j].attention(*args), args[0].shape)
    lo, hi = values[inverse[:len(i)]], values[inverse[len(i):]]
    return lo + (context / GRID - i) * (hi - lo)


def prefill_on_grid(parts: list, part_ix, batch, new, past) -> np.ndarray:
    """:meth:`StepModel.attention_prefill_s` on arrays: chunks of more than 64 tokens off the
    16-token grid of lengths interpolate between its neighbours."""
    exact = (new <= 64) | (new % GRID == 0)
    lo = np.where(exact, new, new // GRID * GRID)
    m = ~exact
    both = on_grid(parts, np.concatenate([part_ix, part_ix[m]]), (np.concatenate([batch, batch[m]]),
                    np.concatenate([lo, lo[m] + GRID])), np.concatenate([past, past[m]]))
    out, above = both[:len(new)], both[len(new):]
    out[m] += (new[m] - lo[m]) / GRID * (above - out[m])
    return out


def decode_attention(decode_parts: dict, tokens, batch, mean) -> np.ndarray:
    """The decode attention of the decodes of mixed steps (their decode kernels)."""
    out = np.zeros(batch.shape)
    for part, toks in decode_parts.values():
        m = np.isin(tokens, toks) & (batch > 0)
        if m.any():
            out[m] = part.attention(batch[m], np.maximum(mean[m], 0))
    return out
