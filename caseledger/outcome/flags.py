"""The evidence a result's trust rests on, as lines: the markdown and HTML reports show the same ones."""

from __future__ import annotations

from dataclasses import dataclass

from caseledger.metrics import Accelerators, HostLoad, NotObserved, Result


@dataclass(frozen=True)
class Flag:
    """One line of evidence a result's trust rests on; `warn`: it weakens or voids the figures."""

    text: str
    warn: bool
    details: tuple[str, ...] = ()
    bullet: bool = False  # shown as an item of the line before it (markdown)


def evidence_flags(result: Result) -> list[Flag]:
    """What the figures' trust rests on: the server's counts checked, load client stalls, the host's CPU, the
    windows a stall, a contended host or a shared device distorted, then each window's accelerators. The markdown
    and HTML reports show the same lines."""
    out: list[Flag] = []
    ck = result.checks
    if ck is None:
        out.append(
            Flag("server counts: not checked (computed by an older processor; reprocess_raw checks them)", warn=False)
        )
    else:
        out.append(
            Flag(
                f"server counts: {ck.invalid} of {ck.checked} successful responses invalid (excluded from "
                f"every figure; max_invalid_share {ck.max_invalid_share:g})",
                warn=ck.invalid > 0,
                details=(
                    *[f"{rule}: {n}" for rule, n in ck.by_reason.items()],
                    *ck.examples,
                    *[f"counter: {c.text}" for c in ck.counters],
                ),
            )
        )
    if result.stalls:
        longest = max(result.stalls, key=lambda x: x.duration_s)
        out.append(
            Flag(
                f"load client stalls: {len(result.stalls)}, {sum(x.duration_s for x in result.stalls):.2f} s "
                f"in all, longest {longest.duration_s:.2f} s from {longest.start_s:.2f} s",
                warn=True,
            )
        )
    else:
        out.append(Flag("load client stalls: none recorded", warn=False))
    host = result.host
    out.append(
        Flag(
            f"host CPU: {host.text}" if isinstance(host, HostLoad) else f"host CPU: NOT_OBSERVED ({host.reason})",
            warn=False,
        )
    )
    for w in (result.windows.whole, result.windows.native):
        out += [Flag(f"{w.name} window distorted: {d}", warn=True, bullet=True) for d in w.distorted]
    return out + _accelerator_flags(result)


def _accelerator_flags(result: Result) -> list[Flag]:
    """Per window: the service host's devices, one detail line each, or NOT_OBSERVED with the reason (one line
    when both windows have the same)."""
    whole, native = result.windows.whole.accelerators, result.windows.native.accelerators
    if isinstance(whole, NotObserved) and whole == native:
        return [Flag(f"accelerators: NOT_OBSERVED ({whole.reason})", warn=False)]
    out: list[Flag] = []
    for w in (result.windows.whole, result.windows.native):
        acc = w.accelerators
        if not isinstance(acc, Accelerators):
            out.append(Flag(f"accelerators, {w.name} window: NOT_OBSERVED ({acc.reason})", warn=False))
            continue
        shared = any(d.used_by_service and d.others for d in acc.devices)
        head = f"accelerators, {w.name} window: {acc.tool}, {acc.samples} samples, {len(acc.devices)} device(s)"
        head += f"; {acc.note}" if acc.note else ""
        out.append(Flag(head, warn=shared, details=tuple(d.text for d in acc.devices)))
    return out
