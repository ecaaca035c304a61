"""`moetune status`: studies, their trials and every decision with its evidence, as text.

    render(store, study_name=None) -> str
    show(db, study_name=None) -> str      # the store named by `db` (None: the default), or why none
"""
from __future__ import annotations

from moetune.experiment.placement import Placement
from moetune.report.overview import spent_sentence
from moetune.store import NoStore, Store
from moetune.tune.summary import one_gpu_ranks, summary


def _ms(v) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


def _figure(key: str, v) -> str:
    """A figure of the evidence as a reader takes it: ms to 0.1, p to three digits."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.1f}" if key.endswith("_ms") else f"{v:.3g}"


def _evidence(d) -> str:
    ev = d.evidence or {}
    bits = []
    for key in ("parent_step_time_ms", "step_time_ms", "profiled_step_time_ms", "p_faster", "noise_ms", "verify"):
        if ev.get(key) is not None:
            bits.append(f"{key}={_figure(key, ev[key])}")
    if ev.get("deciding"):
        bits.append("deciding=" + ",".join(f"{e.get('metric')}={_figure('', e.get('value'))}"
                                             for e in ev["deciding"][:3]))
    return ("  [" + "; ".join(bits) + "]") if bits else ""


def render_study(store, name: str) -> str:
    study = store.study(name)
    s = summary(store, name)
    lines = [f"study {study.name} ({study.state}) model {study.model}: {s['trials']} trials run, "
             f"{s['skipped']} skipped; judged (median of steady steps): baseline "
             f"{_ms(s['baseline_judged_step_time_ms'])} ms, best {_ms(s['best_judged_step_time_ms'])} ms "
             f"(trial {s['best_trial'] or '-'})"]
    if s.get("stop_reason"):
        lines.append(f"  stopped: {s['stop_reason']}")
    lines.append(f"  {spent_sentence(s)}")
    # throughput at the judged step, peak memory in GiB (analysis/figures.py); profiled: the traced mean
    lines.append(f"  {'#':>3} {'id':>4} {'fix':<28} {'state':<10} {'judged ms':>9} {'profiled':>9} "
                 f"{'tokens/s':>9} {'TFLOP/s':>8} {'peak GiB':>8} {'wall':<14} hash")
    for t in store.trials(study.id):
        m = store.metrics(t.id)
        tokens = m.get("tokens_per_s")
        lines.append(f"  {t.number:>3} {t.id:>4} {(t.fix or 'baseline')[:28]:<28} {t.state:<10} "
                     f"{_ms(m.get('judged_step_time_ms')):>9} {_ms(t.step_time_ms):>9} "
                     f"{(f'{tokens:.0f}' if tokens else '-'):>9} {_ms(t.tflops_per_gpu):>8} "
                     f"{(f'{t.peak_memory_gb:.2f}' if t.peak_memory_gb else '-'):>8} {(t.wall or '-'):<14} "
                     f"{t.config_hash}")
    lines += one_gpu_lines(store, study)
    lines.append("  decisions:")
    number = {t.id: t.number for t in store.trials(study.id)}
    for d in store.decisions(study.id):
        where = f"trial {number.get(d.trial_id)}" if d.trial_id else "study"
        lines.append(f"    {d.created_at} {d.kind:<11} {where:<9} {d.rule or '':<26} {d.reason}"
                     f"{_evidence(d)}")
    return "\n".join(lines)


def one_gpu_lines(store, study) -> list[str]:
    """In a one-GPU study, the rank that stood for each trial's layout, and why."""
    if not Placement.of_study(study.experiment).one_gpu:
        return []
    trials = ((t.number, t.folder) for t in store.trials(study.id))
    return [f"  one GPU, {'trial' if len(n) == 1 else 'trials'} {', '.join(map(str, n))}: rank {b['rank']} "
            f"stood for the layout ({b['why']})" for b, n in one_gpu_ranks(trials)]


def render(store, study_name: str | None = None) -> str:
    if study_name:
        return render_study(store, study_name)
    studies = store.studies()
    if not studies:
        return f"no studies in {store.url}; run `moetune tune MODEL` or `make demo`"
    return "\n\n".join(render_study(store, s.name) for s in studies)


def show(db: str | None, study_name: str | None = None) -> str:
    """`moetune status`: render() of the store at `db`; without a store, a line saying so."""
    try:
        store = Store(db, read_only=True)
    except NoStore as e:
        return f"no studies: {e}"
    return render(store, study_name)
