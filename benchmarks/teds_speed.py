"""Speed of mmrl's TEDS against table_recognition_metric.TEDS (IBM's apted-based code) on a 20x10 table.

The prediction is a perturbed copy of the reference: 10% of cell texts edited, two cells merged with colspan=2, one
cell dropped and one header cell bolded, so neither structure-only nor full TEDS can take the identical-tree shortcut.
Both metrics parse the HTML inside the timed call, and every timed call gets a table pair of a shape not seen
before (mmrl caches per-shape index arrays, which helps a reward scoring many rollouts against one reference but
would flatter a benchmark that repeats one pair). Prints per-mode median timings and a final line
``teds/s: mmrl X peer Y ratio Z`` (calls per second, summed over the structure-only and full calls).

    OMP_NUM_THREADS=1 python benchmarks/teds_speed.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import random
import time

from table_recognition_metric import TEDS

from mmrl.rewards.teds import teds


def make_table(rows: int, cols: int, *, perturb: bool, seed: int = 0) -> str:
    """A ``rows`` x ``cols`` table with a header row; ``perturb`` applies the edits described in the module doc.

    The seed also moves the merged and dropped cells (and, unperturbed, one reference colspan), so every seed gives
    trees of a new shape and no call can reuse shape-keyed work cached by an earlier one.
    """
    rng = random.Random(seed)
    merge_row, drop_row, ref_row = rng.randrange(rows - 1), rng.randrange(rows - 1), rng.randrange(rows - 1)
    out = ["<html><body><table><thead><tr>"]
    out += [
        f"<td>{'<b>' if perturb and c == 3 else ''}Col {c}{'</b>' if perturb and c == 3 else ''}</td>"
        for c in range(cols)
    ]
    out.append("</tr></thead><tbody>")
    for r in range(rows - 1):
        cells = [f"{(r + 1) * (c + 3) * 1.37:.2f}" for c in range(cols)]
        if perturb:
            cells = [t[::-1] + "x" if rng.random() < 0.1 else t for t in cells]
        tds = [f"<td>{t}</td>" for t in cells]
        if perturb and r == merge_row:
            tds[2:4] = [f'<td colspan="2">{cells[2]} {cells[3]}</td>']
        if perturb and r == drop_row:
            del tds[7]
        if not perturb and r == ref_row:
            tds[5:7] = [f'<td colspan="2">{cells[5]}</td>']
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table></body></html>")
    return "".join(out)


def time_calls(fn, pairs: list[tuple[str, str]]) -> float:
    """Median seconds of one call over distinct (prediction, reference) pairs."""
    times = []
    for pred_html, true_html in pairs:
        t0 = time.perf_counter()
        fn(pred_html, true_html)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=7, help="distinct table pairs timed per metric and mode"
    )
    args = parser.parse_args()
    pairs = [
        (make_table(20, 10, perturb=True, seed=s), make_table(20, 10, perturb=False, seed=s))
        for s in range(args.repeats)
    ]
    peer_pairs = pairs[: max(1, args.repeats // 2)]
    ours_total = peer_total = 0.0
    for structure_only in (True, False):
        peer = TEDS(structure_only=structure_only)
        ours_value = teds(*pairs[0], structure_only=structure_only)
        peer_value = peer(*pairs[0])
        t_ours = time_calls(lambda p, t, s=structure_only: teds(p, t, structure_only=s), pairs[1:] or pairs)
        t_peer = time_calls(peer, peer_pairs)
        ours_total += t_ours
        peer_total += t_peer
        mode = "structure-only" if structure_only else "full"
        print(
            f"{mode:>14}: mmrl {t_ours * 1e3:8.2f} ms (TEDS {ours_value:.6f})  "
            f"peer {t_peer * 1e3:8.2f} ms (TEDS {peer_value:.6f}, tree-size normaliser)  ratio {t_peer / t_ours:6.1f}x"
        )
    print(f"teds/s: mmrl {2 / ours_total:.1f} peer {2 / peer_total:.1f} ratio {peer_total / ours_total:.1f}")


if __name__ == "__main__":
    main()
