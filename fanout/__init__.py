"""fanout: run an AI agent's parallel tool calls under trio, every call answered.

Read top-down: values (``ToolCall``, ``ToolResult``), primitives (``TokenBucket``,
``Budget``, ``Scope``, ``RetryPolicy``), scheduling (``Runner``, ``Turn``),
then the edges (adapters for the Anthropic and OpenAI SDKs).

Names most code never needs live in submodules: ``fanout.idempotency`` (the
store protocol, its values, the read cache, how a write's key is made),
``fanout.http`` (``NotSentError`` and the rate-limit header reader),
``fanout.redis``, ``fanout.mcp``, ``fanout.httpx2``, ``fanout.testing`` and
``fanout.contrib``.
"""

from ._adapters import anthropic_tool_results as anthropic_tool_results
from ._adapters import calls_from_anthropic as calls_from_anthropic
from ._adapters import calls_from_openai as calls_from_openai
from ._adapters import openai_tool_messages as openai_tool_messages
from ._binding import ArgumentError as ArgumentError
from ._bucket import Booking as Booking
from ._bucket import BucketStatistics as BucketStatistics
from ._bucket import ServerCount as ServerCount
from ._bucket import TokenBucket as TokenBucket
from ._budget import Budget as Budget
from ._budget import Verdict as Verdict
from ._context import CallContext as CallContext
from ._context import current_call as current_call
from ._definitions import ToolDefinition as ToolDefinition
from ._events import Event as Event
from ._events import EventDetail as EventDetail
from ._events import EventKind as EventKind
from ._events import Instrument as Instrument
from ._exceptions import ConfigurationError as ConfigurationError
from ._exceptions import FanoutError as FanoutError
from ._exceptions import InvalidTurnError as InvalidTurnError
from ._exceptions import LimiterUnavailableError as LimiterUnavailableError
from ._exceptions import QuotaExhaustedError as QuotaExhaustedError
from ._exceptions import RateLimitedError as RateLimitedError
from ._exceptions import ToolSignal as ToolSignal
from ._exceptions import TransientError as TransientError
from ._exceptions import UsageError as UsageError
from ._history import repair_anthropic_history as repair_anthropic_history
from ._history import repair_openai_history as repair_openai_history
from ._history import repair_responses_input as repair_responses_input
from ._http import FanoutTransport as FanoutTransport
from ._http import http_client as http_client
from ._output import Document as Document
from ._output import Image as Image
from ._output import Text as Text
from ._registry import Registry as Registry
from ._registry import ToolSpec as ToolSpec
from ._responses import calls_from_responses as calls_from_responses
from ._responses import responses_tool_outputs as responses_tool_outputs
from ._retry import RetryBudget as RetryBudget
from ._retry import RetryBudgetStatistics as RetryBudgetStatistics
from ._retry import RetryPolicy as RetryPolicy
from ._run import Run as Run
from ._runner import Runner as Runner
from ._runner import RunnerStatistics as RunnerStatistics
from ._scope import Scope as Scope
from ._scope import ScopeLike as ScopeLike
from ._scope import ScopeStatistics as ScopeStatistics
from ._scope import concurrency_for as concurrency_for
from ._secrets import Secret as Secret
from ._secrets import register_secret as register_secret
from ._slots import Leaving as Leaving
from ._streaming import StreamingTurn as StreamingTurn
from ._streams import AnthropicStream as AnthropicStream
from ._streams import ChatCompletionsStream as ChatCompletionsStream
from ._streams import ResponsesStream as ResponsesStream
from ._streams import StreamDecoder as StreamDecoder
from ._streams import Unfinished as Unfinished
from ._turn import Turn as Turn
from ._values import Kind as Kind
from ._values import Status as Status
from ._values import ToolCall as ToolCall
from ._values import ToolResult as ToolResult

__all__ = [
    "AnthropicStream",
    "ArgumentError",
    "Booking",
    "BucketStatistics",
    "Budget",
    "CallContext",
    "ChatCompletionsStream",
    "ConfigurationError",
    "Document",
    "Event",
    "EventDetail",
    "EventKind",
    "FanoutError",
    "FanoutTransport",
    "Image",
    "Instrument",
    "InvalidTurnError",
    "Kind",
    "Leaving",
    "LimiterUnavailableError",
    "QuotaExhaustedError",
    "RateLimitedError",
    "Registry",
    "ResponsesStream",
    "RetryBudget",
    "RetryBudgetStatistics",
    "RetryPolicy",
    "Run",
    "Runner",
    "RunnerStatistics",
    "Scope",
    "ScopeLike",
    "ScopeStatistics",
    "Secret",
    "ServerCount",
    "Status",
    "StreamDecoder",
    "StreamingTurn",
    "Text",
    "TokenBucket",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "ToolSignal",
    "ToolSpec",
    "TransientError",
    "Turn",
    "Unfinished",
    "UsageError",
    "Verdict",
    "anthropic_tool_results",
    "calls_from_anthropic",
    "calls_from_openai",
    "calls_from_responses",
    "concurrency_for",
    "current_call",
    "http_client",
    "openai_tool_messages",
    "register_secret",
    "repair_anthropic_history",
    "repair_openai_history",
    "repair_responses_input",
    "responses_tool_outputs",
]
