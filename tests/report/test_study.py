"""report/study.py, the study's reports: Markdown and the self-contained HTML page of a study run on the CPU stand-in bank;
every string from a trace, log or config is escaped; the page renders in headless Chromium."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis import timeline
from moetune.job.paths import TrialPaths
from moetune.report import study as report
from moetune.trial import traces
from moetune.tune import loop as tuner
from moetune.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402

pytestmark = pytest.mark.e2e  # whole tuning studies: make test runs them, make unit leaves them out

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "moe_proxy.yaml")
EVIL = "<script>document.title='pwned'</script>"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    standin_bank.build(tmp / "bank")
    store = Store(str(tmp / "db.sqlite"))
    s = tuner.tune(EXPERIMENT, store, executor="replay", runs_root=tmp / "runs",
                   bank_dir=tmp / "bank", progress=False)
    md, html = report.write_reports(store, s["study"], tmp / "reports")
    return store, s, md, html


def test_markdown_has_every_part(study):
    """The Markdown report of a stand-in study has every section, the judged best with its trial,
    the best config's command line, and one bottleneck section per trial."""
    store, s, md, _ = study
    text = md.read_text()
    for part in ("## Headline", "## Trials", "Best config: changes from the baseline", "## Bottleneck reports",
                 "## Appendix: configuration and command lines", "Best config (trial",
                 "| deciding rule |", "| kernel class |", "| top kernel |", "Decision: **keep**",
                 "Memory: peak", "GPU idle", "ms waiting for a late peer"):
        assert part in text, part
    assert f"best {s['best_judged_step_time_ms']:.1f} ms (trial {s['best_trial']})" in text
    assert "--micro-batch-size 4" in text  # the best config's command line
    # one bottleneck section per trial
    trials = store.trials(store.study(s["study"]).id)
    assert len(re.findall(r"^### Trial \d+", text, re.M)) == len(trials)


def test_html_has_its_plots(study):
    """The HTML page has a timeline per trial, the breakdown and step-time plots, one point per
    trial, and no script or outside link."""
    store, s, _, html = study
    text = html.read_text()
    assert text.count('<svg class="timeline"') == s["trials"]
    assert '<svg class="breakdown"' in text and '<svg class="steptimes"' in text
    assert text.count("<circle") == s["trials"]
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_report_opens_no_trace(study, tmp_path):
    """With every trial's trace files deleted, the report is the same: its timelines and top
    kernels are the analyze stage's files."""
    store, s, md, html = study
    gone = [p for t in store.trials(store.study(s["study"]).id) if t.folder
            for p in Path(t.folder).glob("trace_*")]
    assert len(gone) >= s["trials"]
    for p in gone:
        p.unlink()
    md2, html2 = report.write_reports(store, s["study"], tmp_path / "again")
    text = html2.read_text()
    assert text.count('<svg class="timeline"') == s["trials"]
    assert md2.read_text() == md.read_text() and text == html.read_text()


def evil_study(tmp_path):
    """A study whose trace, log, config, command line and names hold markup."""
    folder = tmp_path / "runs" / "t1"
    folder.mkdir(parents=True)
    standin_bank.write_trace(folder / "trace_0.sqlite", "evil", dict(standin_bank.BASE_STEP),
                             extra_kernels=(EVIL,))
    standin_bank.write_log(folder / "log.txt", dict(standin_bank.BASE_STEP), "evil")
    an = analysis.analyze([str(folder / "trace_0.sqlite")], log=str(folder / "log.txt"))
    (folder / "analysis.json").write_text(json.dumps(an, default=str))
    # what the analyze stage keeps of the window beside it: the report reads no trace
    traces.write_views(TrialPaths(folder), timeline.trace_views([folder / "trace_0.sqlite"]))
    (folder / "command.txt").write_text(f"python -m pipeline.train_moe --name '{EVIL}'\n")
    store = Store(str(tmp_path / "db.sqlite"))
    st = store.create_study(f"s{EVIL}", model=f"m{EVIL}")
    cfg = {"router_dtype": EVIL, "tp": 1}
    t = store.add_trial(st.id, cfg, "h1", fix=None)
    store.update_trial(t.id, folder=str(folder), state="completed", step_time_ms=500.0,
                       wall="host_overhead", tflops_per_gpu=40.0)
    store.add_decision(st.id, "keep", f"baseline {EVIL}", trial_id=t.id,
                       evidence={"last_lines": [EVIL]})
    store.add_decision(st.id, "skip", f"refused: {EVIL}", rule=f"r{EVIL}")
    store.add_decision(st.id, "stop", f"stop {EVIL}")
    return store, st.name


def test_every_string_is_escaped(tmp_path):
    """Markup in a trace's kernel name, a log, a config, a command line and the study's names
    reaches the HTML escaped, every time."""
    store, name = evil_study(tmp_path)
    md, html = report.write_reports(store, name, tmp_path / "out")
    text = html.read_text()
    assert "<script" not in text
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in text
    # the kernel name reached the report (top kernels), escaped
    assert text.count("&lt;script&gt;") >= 6
    assert md.exists() and html.name.endswith(".html") and "/" not in html.name[:-5]


CHROMIUM = shutil.which("chromium")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium(args, tmp_path):
    return subprocess.run([CHROMIUM, *HEADLESS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.chromium
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_html_renders_in_chromium(study, tmp_path):
    """Headless Chromium renders the page with its title, a timeline, legend and evidence rows per
    trial, and a screenshot that is not blank."""
    _, s, _, html = study
    dom = chromium(["--dump-dom", html.resolve().as_uri()], tmp_path).stdout
    assert "<h1>moetune study" in dom
    assert dom.count('class="timeline"') == s["trials"]
    assert len(re.findall(r"<rect", dom)) > 50 and dom.count("<circle") == s["trials"]
    # every plot carries its legend; every trial its evidence rows
    assert dom.count('class="legend"') == s["trials"] + 2
    assert dom.count("Idle causes: launch-starved") == s["trials"] and dom.count("Kernels: ") == s["trials"]
    shot = tmp_path / "shot.png"
    chromium([f"--screenshot={shot}", "--window-size=1000,1600", html.resolve().as_uri()], tmp_path)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a blank page is ~5 KB


@pytest.mark.chromium
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_demo_screenshots(demo, tmp_path):
    """The study page and trial 1's bottleneck report as Chromium draws them (how docs/report-*.png
    are made); each page's plots carry a legend."""
    store = demo[0]
    r = report.build(store, "moe_proxy-replay")
    pages = {"study": demo[3], "bottleneck": report.section_page(r.sections[0])}
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(text)
        dom = chromium(["--dump-dom", page.resolve().as_uri()], tmp_path).stdout
        assert 'class="legend"' in dom and "Idle causes:" in dom, name
        shot = tmp_path / f"report-{name}.png"
        chromium([f"--screenshot={shot}", "--hide-scrollbars", "--window-size=1150,1400", page.resolve().as_uri()],
                 tmp_path)
        assert len(shot.read_bytes()) > 50_000, name  # drawn, not blank


@pytest.mark.chromium
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_script_in_a_kernel_name_renders_as_text(tmp_path):
    """A script in a kernel name does not run in Chromium (the title stays) and shows as text."""
    store, name = evil_study(tmp_path)
    _, html = report.write_reports(store, name, tmp_path / "out")
    dom = chromium(["--dump-dom", html.resolve().as_uri()], tmp_path).stdout
    assert "<h1>" in dom
    assert "<title>pwned</title>" not in dom  # the script would have set the title
    assert "<script" not in dom
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # shown as text


def test_all_to_all_split_says_when_one_rank_cannot_split_it():
    """One rank's trace: the advice to trace more ranks only where the study asked for one; where it
    asked for two and one came back, that is what the row says."""
    two = report.a2a_split({"a2a_ms": 300.0, "a2a_wait_ms": 290.0, "a2a_transfer_ms": 10.0, "ranks": 2})
    assert "290.00 ms waiting for a late peer and 10.00 ms transfer (2 ranks traced)" in two
    c = {"a2a_ms": 300.0, "a2a_wait_ms": 0.0, "a2a_transfer_ms": 300.0, "ranks": 1}
    one = report.a2a_split(c, [0])
    assert "not split" in one and "set cluster.profile_ranks to two ranks or more" in one
    asked_two = report.a2a_split(c, [0, 1])
    assert "set cluster.profile_ranks" not in asked_two
    assert "one rank's trace was read though cluster.profile_ranks names [0, 1]" in asked_two
    assert report.a2a_split({"a2a_ms": 0.0, "ranks": 2}) is None


def test_memory_figure_names_its_source():
    """The device's figure (from the trace) and the GPU table's are both labelled with their source
    and unit: the table's H200 is CUDA's measured capacity, a type moetune has not measured its data
    sheet's GB."""
    assert report.memory_fact(16.594, 139.80072, "H200") == (
        "Memory: peak 16.59 GiB held through CUDA (trace) of 139.8 GiB the device reports to CUDA "
        "(H200 as CUDA reports it: 139.8 GiB)")
    assert report.memory_fact(16.594, None, "B300") == (
        "Memory: peak 16.59 GiB held through CUDA (trace) (B300 data sheet: 270 GB)")
    assert report.memory_fact(13.36, None, None, "log") == "Memory: peak 13.36 GiB max allocated by PyTorch (log)"


# ---- the demo's study: one honest headline, the same evidence in both formats ----------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`moetune demo` run through the command line; its store, Markdown and HTML."""
    tmp = tmp_path_factory.mktemp("demo")
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "demo", "--no-progress"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    store = Store(str(tmp / ".moetune" / "moetune.db"))
    return store, r.stdout, (tmp / "reports" / "moe_proxy-replay.md").read_text(), \
        (tmp / "reports" / "moe_proxy-replay.html").read_text()


def test_demo_headline_gives_one_judged_speedup(demo):
    """The headline is the judged (median of steady steps) baseline → best with its rank test and
    walls; the profiled mean, inflated by one stall, is labelled and only follows; the unstable
    baseline is flagged; each kept fix is named once with its change."""
    store, out, text, page = demo
    head = text.split("## Headline", 1)[1].split("## Trials", 1)[0]
    assert head.count("x faster") == 1 and "speed-up" not in text
    assert "baseline 461.7 ms → best 253.5 ms (trial 3), 1.82x faster (rank test p=" in head
    assert "Wall: host_overhead → host_overhead" in head
    assert head.index("Judged step time") < head.index("Profiled step time (mean of the traced steps")
    assert "trial 1's profiled steps are unstable: 868.6 ms ± 852.9 ms" in head
    assert "trial 2 larger_micro_batch (`micro_batch` 2 → 4); trial 3 larger_micro_batch (`micro_batch` 4 → 8)" in head
    assert "larger_micro_batch, larger_micro_batch" not in text and "keep** — baseline" not in text
    assert "Decision: **baseline** — the reference" in text
    assert "1.82x faster (rank test p=" in page and "speed-up" not in page
    assert "best 253.5 ms/step (baseline 461.7 ms, judged)" in out  # what `moetune demo` prints


def test_demo_figures_agree_on_one_step_time(demo):
    """The baseline's decision records the judged step the summary prints (461.7 ms, not the
    profiled 868.6), with the profiled mean beside it; TFLOP/s/GPU is at the judged step (Megatron
    printed 58.9 at 461.7 ms), so its ratio best/baseline is the judged speed-up, not the 2.38x the
    mean of per-iteration rates gave."""
    store, out, text, _ = demo
    study = store.study("moe_proxy-replay")
    trials = {t.number: t for t in store.trials(study.id)}
    base = next(d for d in store.decisions(study.id) if d.kind == "keep" and d.trial_id == trials[1].id)
    assert base.evidence["step_time_ms"] == pytest.approx(461.7)
    assert base.evidence["profiled_step_time_ms"] == pytest.approx(868.6, abs=0.05)
    assert "baseline 461.7 ms, judged" in out
    assert trials[1].tflops_per_gpu == pytest.approx(58.9, abs=0.1)
    assert trials[3].tflops_per_gpu / trials[1].tflops_per_gpu == pytest.approx(461.7 / 253.5, rel=0.01)
    assert "Throughput at the judged step: 70972 → 129262 tokens/s, 58.9 → 107.3 TFLOP/s/GPU." in text
    assert "Step time, judged: 461.7 ms (median of 9 steady log steps, ± 64.9 ms); 70972 tokens/s, " \
           "58.9 TFLOP/s/GPU at the judged step" in text


def test_demo_figures_have_sensible_precision(demo):
    """Step times with one decimal, counts as integers, no all-zero kernel class rows."""
    _, out, text, _ = demo
    assert not re.search(r"\d\.\d{3,} ms", out + text.split("## Appendix")[0])
    assert "2887 gaps over 100 us" in text and "2887.0" not in text
    assert "CUDA graph launches 0" in text and "| deepep | 0.00 | 0 |" not in text
    assert "Kernels: 5133 per step" in text


def test_html_and_markdown_hold_the_same_evidence(demo):
    """Both formats are rendered from one model: every evidence row, sentence and table cell of every
    trial is in both (escaped for HTML)."""
    store, _, text, page = demo
    r = report.build(store, "moe_proxy-replay")
    for needle in ("Idle causes: launch-starved 1643.3 ms", "Kernels: 5133 per step, median kernel 9.4 us",
                   "peak 16.59 GiB held through CUDA (trace) of 139.8 GiB the device reports to CUDA "
                   "(H200 as CUDA reports it: 139.8 GiB)"):
        assert needle in text and report.esc(needle) in page, needle
    for sec in r.sections:
        for fact in sec.facts:
            assert report.md(fact) in text and report.esc(fact) in page, fact
        for table in sec.tables:
            for row in table.rows:
                for cell in row:
                    assert report.esc(cell) in page and report.md(cell) in text, cell
    for line in r.headline + r.warnings:
        assert report.md(line) in text
        assert report.esc(line.split("`")[0]) in page


def test_demo_profile_ranks_advice_fits_the_trial(demo):
    """The demo's trial 3 replays a recording of rank 0 alone while the study asked for ranks 0 and
    1: the report says a rank's trace is missing, not to set profile_ranks, which it already has."""
    _, _, text, _ = demo
    trial3 = text.split("### Trial 3", 1)[1].split("###", 1)[0]
    assert "not split into transfer and waiting (one rank's trace was read though " \
           "cluster.profile_ranks names [0, 1]" in trial3
    assert "set cluster.profile_ranks to two ranks or more" not in text


@pytest.fixture(scope="module")
def demo_te(tmp_path_factory):
    """`moetune demo moe_proxy_te` through the command line: (stdout, stderr, Markdown, store)."""
    tmp = tmp_path_factory.mktemp("demo_te")
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "demo", "moe_proxy_te"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr, (tmp / "reports" / "moe_proxy_te-replay.md").read_text(), \
        Store(str(tmp / ".moetune" / "moetune.db"))


def test_te_demo_replays_only_what_its_bank_holds(demo_te):
    """The TE demo proposes only configs the bank recorded: no trial is skipped for a config the bank
    lacks, no rule is applied twice, each rule it passed over for the bank is one skip decision."""
    out, err, text, store = demo_te
    assert "not in the trial bank" not in out + err + text
    study = store.study("moe_proxy_te-replay")
    applied = [d.rule for d in store.decisions(study.id) if d.kind == "apply"]
    assert applied and len(applied) == len(set(applied)), applied
    assert all(t.state == "completed" for t in store.trials(study.id))
    lacking = [(d.rule, (d.evidence or {}).get("parent")) for d in store.decisions(study.id)
               if d.kind == "skip" and "the trial bank holds no recorded run" in d.reason]
    assert lacking and len(lacking) == len(set(lacking))
    assert "0 skipped" in text and "## Rules skipped" in text


def test_fix_reason_is_the_wall_or_condition_that_proposed_it(demo_te):
    """A fix for the parent's wall says so; a rule of another wall proposed on its own metric condition
    names that condition with the parent's value, not the parent's wall."""
    _, _, text, store = demo_te
    # grouped_gemm is a compute rule with no metric condition: it came once the host_overhead fixes
    # were passed over (the bank lacks them); cuda_graphs_te answers the host_overhead wall itself
    assert ("Fix: grouped_gemm — a compute fix, proposed on its preconditions alone, not on trial 1's "
            "wall (host_overhead)") in text
    assert "Fix: cuda_graphs_te — answers trial 2's host_overhead wall, confidence 0.95:" in text
    # predicted ms and measured/model beside the judged ms (tune/predicted.py)
    assert re.search(r"\| grouped_gemm \| completed \| keep \| 364\.6 \| \d+\.\d \| \d+\.\d\d \| -33\.6% \| "
                     r"0\.00014 \| 416\.2 \| 74\.7 \| host_overhead \| compute preconditions \|", text)
    views = {v.trial.number: v for v in report.gather(store, "moe_proxy_te-replay")[1]}
    parent, child = views[2], views[3]
    # the same trial as if the communication rule ep_a2a_overlap had been proposed on it
    child.trial.fix = "ep_a2a_overlap"
    why = report.fix_reason(child, parent)
    assert why.startswith("a communication fix, proposed on its own condition exposed_a2a_share_net ")
    assert "(ge 0.03), not on trial 2's wall (host_overhead)" in why
    assert "answers" not in why
