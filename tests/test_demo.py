"""The demo (`python -m fanout demo`): it runs, answers every call, and tells the truth."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from fanout import __main__ as cli
from fanout._demo import DemoOptions, plan_calls, run_demo

# Fast limits for the tests that are not about the defaults: the same story in ~0.5 s.
FAST = ["--rate", "20", "--burst", "4", "--latency", "0.02"]


def demo_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli.main(["demo", "--json", *args]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_default_demo_answers_every_call_and_matches_the_server_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's demo exits 0; every id answered once; fanout's count is the server's."""
    document = demo_json(capsys)
    ids = [call["id"] for call in document["calls"]]
    assert len(ids) == 12
    assert [r["tool_use_id"] for r in document["results"]] == ids
    assert [b["tool_use_id"] for b in document["message"]["content"]] == ids
    summary = document["summary"]
    assert summary["all_answered"] is True
    assert summary["requests_sent"] == summary["server_requests"]
    assert summary["server_requests"] == sum(summary["server_statuses"].values())


def test_default_demo_shows_a_retry_a_coalesced_search_and_a_refused_write(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The injected 500 is retried, the repeated search runs once, policy 'one' refuses a write."""
    summary = demo_json(capsys, *FAST)["summary"]
    assert summary["server_statuses"].get("500") == 1
    assert [r["reason"] for r in summary["retries"]] == ["TransientError"]
    assert summary["coalesced"] == [{"call_id": "toolu_10", "leader": "toolu_01"}]
    assert summary["refused"] == [{"call_id": "toolu_12", "tool": "update_ticket"}]
    assert summary["results_by_status"] == {"ok": 11, "refused": 1}
    assert summary["learned"] == {"scope": "crm", "rate": 2.0, "burst": 2.0}


def test_serial_policy_runs_both_writes_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    """--policy serial: no refusal, and the two writes reach the server comment-first."""
    document = demo_json(capsys, *FAST, "--policy", "serial", "--faults", "0")
    assert document["summary"]["results_by_status"] == {"ok": 12}
    writes = [
        e["detail"]["method"]
        for e in document["events"]
        if e["kind"] == "request_sent" and e["detail"]["method"] in ("POST", "PATCH")
    ]
    assert writes == ["POST", "PATCH"]


def test_text_output_has_the_live_lines_the_message_and_the_summary() -> None:
    """Not a terminal: plain lines (no ANSI), the model's message as JSON, then the summary."""
    out = io.StringIO()
    options = DemoOptions(calls=6, rate=20, burst=4, latency=0.02, faults=0)
    assert run_demo(options, out=out) == 0
    text = out.getvalue()
    assert "\x1b[" not in text
    live = text[text.index("Live:") : text.index("The message that goes back")]
    for call in plan_calls(6):
        assert f"{call.id}" in live
    message = text[text.index("{") : text.index("\nSummary")]
    assert len(json.loads(message)["content"]) == 6
    assert "6 of 6 calls answered" in text


@pytest.mark.parametrize("n", [1, 3, 4, 12, 20])
def test_the_planned_turn_has_the_requested_number_of_calls(n: int) -> None:
    """--calls N plans N calls with unique ids; from 4 on, it ends with a repeat and two writes."""
    calls = plan_calls(n)
    assert len(calls) == n
    assert len({c.id for c in calls}) == n
    if n >= 4:
        assert [c.name for c in calls[-3:]] == ["search_tickets", "add_comment", "update_ticket"]
        assert calls[-3].arguments == calls[0].arguments


def test_bad_options_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--calls 0 exits with argparse's usage error (2), not a traceback."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["demo", "--calls", "0"])
    assert exited.value.code == 2
    assert "calls" in capsys.readouterr().err


def test_no_command_prints_the_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m fanout` alone lists its commands and exits 0."""
    assert cli.main([]) == 0
    assert "demo" in capsys.readouterr().out


def test_the_message_to_the_model_is_the_same_on_every_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Timings differ between runs; the transcript does not (answers never carry timing)."""
    first = demo_json(capsys, *FAST)["message"]
    second = demo_json(capsys, *FAST)["message"]
    assert json.dumps(first) == json.dumps(second)


def test_stream_demo_starts_reads_while_the_message_arrives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--stream: the first read starts mid-message, the write after its end; same transcript."""
    streamed = demo_json(capsys, *FAST, "--stream", "0.6")
    events, summary = streamed["events"], streamed["summary"]
    ended = summary["stream"]["message_ended_s"]
    started = {}
    for event in events:
        if event["kind"] == "started":
            started.setdefault(event["call_id"], event["t"])
    assert started["toolu_01"] < ended  # the message was still arriving
    assert started["toolu_11"] >= ended  # the write waited for the whole message
    assert "toolu_01" in summary["stream"]["started_while_arriving"]
    assert summary["all_answered"] is True
    whole = demo_json(capsys, *FAST)
    assert "stream" not in whole["summary"]  # the default demo is unchanged
    assert json.dumps(streamed["message"]) == json.dumps(whole["message"])


def test_stream_demo_text_shows_the_model_writing_while_calls_run() -> None:
    """Plain output: the model's progress lines, a call running before 'message complete'."""
    out = io.StringIO()
    options = DemoOptions(calls=6, rate=20, burst=4, latency=0.02, faults=0, stream=0.4)
    assert run_demo(options, out=out) == 0
    text = out.getvalue()
    live = text[text.index("Live:") : text.index("The message that goes back")]
    assert "(model)                   wrote call 1 of 6, still writing" in live
    assert live.index("toolu_01  search_tickets  running") < live.index("message complete")
    # A 0.4 s stream in real time: a busy machine delivers its last chunk a few ms late.
    assert re.search(r"the message took 0\.4\ds to arrive", text)
