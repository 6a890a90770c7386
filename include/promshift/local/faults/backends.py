"""Faults of the backends: 1, 2 the target down during warm-up or parity; 3 a 429 storm during
latency; 4 a reload the source refuses; 14 the source restarted mid-dual-write.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from promshift.core.events import EventKind
from promshift.core.render import remote_write_name
from promshift.local.faults.env import (
    GROUP,
    MIN_LOSS_WINDOW_S,
    Fault,
    FaultEnv,
    FaultResult,
    deploy,
    now,
    rollback,
    small_group,
    wait_parity_window,
    warm_up,
)
from promshift.local.stack.local import SCRAPE_JOB, SOURCE, TARGET

# -- 1, 2: the target down ---------------------------------------------------------------------------------------


def fault_target_down_warmup(env: FaultEnv) -> FaultResult:
    f = Fault(env, "target down during warm-up", "warming")
    audit = env.audit(env.sqlite_url("f1"), "f1")
    m = env.migration(audit, "manual__fault-1")
    snap, deployed = deploy(m)
    env.stop(TARGET)
    try:
        event = warm_up(m, float(deployed["dual_write_since"]), timeout_s=10.0)
        rolled = rollback(m, snap)
    finally:
        env.restart_missing()
    f.details.update(warmup_event={k: event.get(k) for k in ("status", "reason")}, rollback=rolled)
    return f.finish(outcome=f"warm-up ended {event['status']!r} ({event.get('reason')}); rolled back, "
                            f"restored_identical={rolled['restored_identical']}",
                    notes="target Prometheus stopped (SIGTERM) after the dual-write deploy; the real WarmupTrigger "
                          "polled it; the source kept its entry until the rollback (its queue retried meanwhile); "
                          "target restarted afterwards",
                    audit=audit, must_have=("dual_write_deployed", "warmup_started", f"warmup_{event['status']}",
                                            "rolled_back"),
                    extra_ok=event["status"] in ("error", "timeout") and rolled["restored_identical"] is True)


def fault_target_down_parity(env: FaultEnv) -> FaultResult:
    f = Fault(env, "target down during parity", "parity")
    audit = env.audit(env.sqlite_url("f2"), "f2")
    m = env.migration(audit, "manual__fault-2")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    event = warm_up(m, since)
    wait_parity_window(m, since)
    env.stop(TARGET)
    try:
        try:
            parity = m.parity(dual_write_since=since, now=now())
            latency = m.latency(now(), dual_write_since=since)
            verdict = m.gate(parity, latency, now())
            step = f"parity {parity.verdict.value}, latency {latency.verdict.value}, gate {verdict.verdict.value}"
            passed = parity.verdict.value == "SUCCESSFUL"
        except Exception as exc:  # noqa: BLE001 - a step that raises fails its task, and the rollback runs
            step = f"parity raised {type(exc).__name__}: {str(exc)[:160]}"
            passed = False
        rolled = rollback(m, snap)
    finally:
        env.restart_missing()
    f.details.update(warmup=event["status"], step=step, rollback=rolled)
    return f.finish(outcome=f"{step}; rolled back, restored_identical={rolled['restored_identical']}",
                    notes="target stopped after warm-up was ready and the parity window had filled; parity, "
                          "latency and the gate ran against it; target restarted afterwards",
                    audit=audit, must_have=("warmup_ready", "rolled_back"),
                    extra_ok=rolled["restored_identical"] is True and not passed)


# -- 3: a 429 storm --------------------------------------------------------------------------------------------


class Always429(ThreadingHTTPServer):
    """Answers every request 429 Too Many Requests (AMP's throttling), counting them."""

    daemon_threads = True

    def __init__(self) -> None:
        self.count = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with lock:
                    server.count += 1
                body = b'{"status":"error","errorType":"throttled","error":"ThrottlingException: Rate exceeded"}'
                self.send_response(429)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> Always429:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()


def fault_429_storm_latency(env: FaultEnv) -> FaultResult:
    f = Fault(env, "429 storm during latency", "latency")
    audit = env.audit(env.sqlite_url("f3"), "f3")
    m = env.migration(audit, "manual__fault-3")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    warm_up(m, since)
    wait_parity_window(m, since)
    parity = m.parity(dual_write_since=since, now=now())
    with Always429() as storm:
        # The same run's latency step, reading the target through a front door that throttles every request.
        throttled = env.migration(audit, m.run_id, backends=env.backends(target_url=storm.url))
        latency = throttled.latency(now(), dual_write_since=since)
    verdict = m.gate(parity, latency, now())
    rolled = rollback(m, snap)
    target_runs = [r for r in latency.runs if r.backend == "target"]
    throttled_runs = [r for r in target_runs if r.error and "throttled" in r.error]
    f.details.update(parity=parity.verdict.value, latency=latency.verdict.value, latency_retries=latency.retries,
                     target_runs=len(target_runs), throttled_runs=len(throttled_runs), http_429_answered=storm.count,
                     gate=verdict.to_dict(), rollback=rolled)
    return f.finish(outcome=f"parity {parity.verdict.value}; latency {latency.verdict.value}: "
                            f"{len(throttled_runs)}/{len(target_runs)} target runs throttled after "
                            f"{latency.retries} retries ({storm.count} answers 429); gate "
                            f"{verdict.verdict.value} -> {verdict.action.value}; rolled back",
                    notes="a local HTTP front door answering every target query 429 (Retry-After: 1) stands in "
                          "for AMP throttling; the local stack has no 429 fault injection; the probe retried "
                          "3 times with backoff and counted each throttled run as failed, never as slow",
                    audit=audit, must_have=("rolled_back",),
                    extra_ok=bool(target_runs) and len(throttled_runs) == len(target_runs)
                    and latency.verdict.value != "SUCCESSFUL" and rolled["restored_identical"] is True)


# -- 4: a reload the source refuses ----------------------------------------------------------------------------


def fault_reload_rejected(env: FaultEnv) -> FaultResult:
    f = Fault(env, "reload rejected by the source", "deploy_dual_write")
    audit = env.audit(env.sqlite_url("f4"), "f4")
    # A keep-regex Go's regexp refuses, and a promtool that accepts anything: the bad config reaches the reload.
    bad = dataclasses.replace(small_group(), metrics=(), metric_regex="DCGM_FI_DEV_FB_(USED")
    m = env.migration(audit, "manual__fault-4")
    m.validate(now())
    snap = m.snapshot(now())
    slipped = env.migration(audit, m.run_id, group=bad, backends=env.backends(promtool="true"))
    try:
        slipped.deploy_dual_write(snap, now())
        error = "none: the deploy went through"
    except Exception as exc:  # noqa: BLE001 - the step fails; its rollback runs next
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    rolled = rollback(m, snap)
    failed = [e for e in audit.events() if e.kind == EventKind.DEPLOY_FAILED]
    f.details.update(error=error, deploy_failed=failed[0].evidence_data if failed else None, rollback=rolled)
    return f.finish(outcome=f"deploy refused at reload ({error[:120]}); deployer restored the snapshot; "
                            f"deploy_failed audited; rollback restored_identical={rolled['restored_identical']}",
                    notes="promtool pointed at /usr/bin/true (a permissive checker) so a keep-regex Prometheus "
                          "refuses ('DCGM_FI_DEV_FB_(USED') slipped past the check; the running source refused the "
                          "reload (HTTP 500) and kept its previous config",
                    audit=audit, must_have=("deploy_failed", "rolled_back"),
                    extra_ok=error.startswith(("DeployError", "DeployStepFailed")) and "dual_write_deployed" not in
                    [e.kind for e in audit.events()])




# -- 14: the source restarted mid-dual-write ----------------------------------------------------------------------


def fault_source_restart(env: FaultEnv) -> FaultResult:
    f = Fault(env, "source Prometheus restarted mid-dual-write", "dual_writing")
    audit = env.audit(env.sqlite_url("f14"), "f14")
    m = env.migration(audit, "manual__fault-14")
    snap, deployed = deploy(m)
    since = float(deployed["dual_write_since"])
    env.wait_for_target(m.group, since)
    entry = remote_write_name(GROUP)
    down_at = time.time()
    env.stop(SOURCE)
    time.sleep(6.0)
    env.restart_missing()
    up_at = time.time()
    loaded_after = entry in env.loaded_entries()
    # Dual-write resumes: the target receives samples newer than the restart.
    resumed_at = env.newest_after(env.target(), f"max(timestamp({m.group.metrics[0]}))", up_at)
    # When the restarted source scrapes again: its newest ``up`` sample is later than the restart.
    scraping_at = env.newest_after(env.source(), f'max(timestamp(up{{job="{SCRAPE_JOB}"}}))', up_at, poll_s=0.5)
    # A whole window after scraping resumed, with our entry still live: what the migration could cost the source.
    time.sleep(max(0.0, (scraping_at or time.time()) + MIN_LOSS_WINDOW_S + 0.5 - time.time()))
    after_end = time.time()
    rolled = rollback(m, snap)
    downtime = up_at - down_at
    window = (down_at - 5.0, max(up_at, resumed_at or up_at) + 5.0)
    f.details.update(process_down_s=round(downtime, 1), entry_loaded_after_restart=loaded_after,
                     target_newest_sample_after_restart=resumed_at, rollback=rolled)
    result = f.finish(outcome=f"source process down {downtime:.1f}s (SIGTERM, restarted); entry loaded after "
                              f"restart: {loaded_after}; dual-write resumed: {resumed_at is not None}; rollback "
                              f"restored_identical={rolled['restored_identical']}",
                      notes="the stack's source process stopped and started again between deploy and rollback; "
                            "source_samples_lost is measured outside the restart (10 s before the stop, and 10 s "
                            "after the source scraped again, our entry live throughout); the restart's own gap is "
                            "measured too (details.samples_lost_over_restart, 5 s before the stop to 5 s after the "
                            "target had new samples) and is the restart's, not promshift's: no scrapes while the "
                            "process is down, and Prometheus starts scraping up to ~5 s after it is ready (its scrape "
                            "manager applies targets on a 5 s tick), so the gap in `up` outlasts the process downtime",
                      audit=audit, must_have=("dual_write_deployed", "rolled_back"), loss_window=window,
                      extra_ok=loaded_after and resumed_at is not None and rolled["restored_identical"] is True)
    gaps = result.details["samples"]["up_gaps"]
    # The restart's own gap (no process, no scrapes) is the fault, not promshift's doing: it is kept as measured,
    # and ``source_samples_lost`` is the loss outside it: before the stop and after scraping resumed.
    outside = [env.samples_lost(m.group, down_at - MIN_LOSS_WINDOW_S - 0.5, down_at - 0.5, f.expected[0])]
    if scraping_at is not None:
        outside.append(env.samples_lost(m.group, scraping_at + 0.5, after_end, f.expected[0]))
    result.details["samples_lost_over_restart"] = result.details["samples"]["lost_total"]
    result.details["samples_outside_restart"] = outside
    result.details["scraping_resumed_s_after_restart"] = (round(scraping_at - up_at, 1)
                                                          if scraping_at is not None else None)
    result.source_samples_lost = (sum(o["lost_total"] for o in outside) if scraping_at is not None else None)
    result.details["scrape_gap_s"] = max((g["gap_s"] for g in gaps), default=0.0)
    result.details["missing_per_series_from_gaps"] = max((sum(g["missing"] for g in gaps if g["instance"] == i)
                                                          for i in {g["instance"] for g in gaps}), default=0)
    return result
