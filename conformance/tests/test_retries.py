"""Our retry layer against a grpcio server that fails the first attempts and
asks for a pause with `grpc-retry-pushback-ms`: what the server saw of every
attempt (how many, `grpc-previous-rpc-attempts`, the budget each carried)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import CONFORMANCE, Process, bin_path, report

# The pause the flaky server asks for between attempts.
PUSHBACK_MS = 150


@pytest.fixture(scope="module")
def flaky():
    try:
        import grpc  # noqa: F401
    except ImportError:
        pytest.fail("grpcio is missing: run scripts/conformance", pytrace=False)
    server = Process("grpcio flaky server", [sys.executable, os.path.join(CONFORMANCE, "python", "flaky.py")])
    yield server
    server.stop()


def call(server, tag, timeout_ms=2000):
    out = subprocess.run(
        [bin_path("interop-retry"), "--server", server.addr, "--tag", tag, "--timeout_ms", str(timeout_ms)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, f"interop-retry failed: {out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def attempts(server, name, count):
    return [server.wait_event("attempt", name) for _ in range(count)]


def test_pushback_paces_the_retries_and_every_attempt_carries_less(flaky):
    result = call(flaky, f"paced/2/{PUSHBACK_MS}", timeout_ms=2000)
    seen = attempts(flaky, "paced", 3)
    report(figure="retry against grpcio", result=result, attempts=seen)
    assert result["status"] == "OK", result
    assert result["attempts"] == 3, result
    assert [a["n"] for a in seen] == [1, 2, 3]
    assert [a["previous"] for a in seen] == [None, "1", "2"], "grpc-previous-rpc-attempts counts the earlier attempts"
    budgets = [a["remaining_us"] for a in seen]
    assert all(0 < b <= 2_000_000 for b in budgets), budgets
    assert budgets[0] > budgets[1] > budgets[2], f"each attempt carries what is left of one deadline: {budgets}"
    gaps_ms = [(b["t_ns"] - a["t_ns"]) / 1e6 for a, b in zip(seen, seen[1:])]
    assert all(g >= PUSHBACK_MS for g in gaps_ms), f"the server's {PUSHBACK_MS} ms pushback replaces the backoff: {gaps_ms}"
    shrink_ms = [(a - b) / 1000 for a, b in zip(budgets, budgets[1:])]
    # The budget shrinks by the time between attempts. What separates the two
    # figures is the difference between the attempts' transits (our header's
    # clock reading to grpcio's deadline on arrival), which a busy core
    # stretches by tens of ms; a budget that did not shrink, or shrank twice,
    # would be off by a whole gap (at least the pushback). Half of it splits
    # the two.
    for gap, shrink in zip(gaps_ms, shrink_ms):
        assert abs(gap - shrink) < PUSHBACK_MS / 2, (
            f"the budget shrinks by the time between attempts: {gaps_ms} vs {shrink_ms}"
        )


def test_a_negative_pushback_stops_retrying(flaky):
    result = call(flaky, "stopped/3/-1")
    seen = attempts(flaky, "stopped", 1)
    assert result["status"] == "UNAVAILABLE", result
    assert result["attempts"] == 1, result
    assert seen[0]["previous"] is None


def test_no_retry_outlives_the_callers_deadline(flaky):
    # Every attempt fails and asks for 400 ms: a 600 ms budget fits the
    # second attempt, not a third. The deadline has not passed when the
    # layer gives up: the answer is the last attempt's (nothing was done),
    # not DEADLINE_EXCEEDED.
    result = call(flaky, "bounded/9/400", timeout_ms=600)
    seen = attempts(flaky, "bounded", 2)
    assert result["status"] == "UNAVAILABLE", result
    assert result["attempts"] == 2, result
    assert result["elapsed_ms"] < 600, result
    assert seen[1]["remaining_us"] < 200_000, seen
