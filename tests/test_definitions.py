"""Tool definitions from signatures, and arguments checked against them before running."""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Annotated, Any, Literal, TypedDict

import attrs
import jsonschema
import pydantic
import pytest
from anthropic.types import ToolParam
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam

import fanout
from fanout import ConfigurationError, Kind, Registry, Runner, Status, ToolCall
from fanout._binding import ArgumentError, bind
from fanout._schema import read_signature, schema_of


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@attrs.frozen
class Place:
    """Where to look.

    Attributes:
        city: The city's English name.
    """

    city: str
    country: str | None = None


@dataclasses.dataclass
class Window:
    days: int
    hourly: bool = False


class Filters(TypedDict, total=False):
    """Optional narrowing."""

    min_temp: float
    tags: list[str]


def forecast(
    place: Place,
    window: Window,
    unit: Unit = Unit.CELSIUS,
    detail: Literal["brief", "full"] = "brief",
    filters: Filters | None = None,
    limit: Annotated[int, "At most this many rows."] = 10,
    coords: tuple[float, float] | None = None,
    extra: dict[str, int] | None = None,
) -> str:
    """Forecast the weather for a place.

    Use it for any question about future weather.

    Args:
        place: Where to forecast.
        window: How far ahead,
            in days.
        unit: Temperature unit.
    """
    return f"{place.city} {window.days} {unit.value} {detail} {filters} {limit} {coords} {extra}"


def test_schema_from_hints_and_docstring() -> None:
    """Every supported hint and each docstring description lands in the JSON Schema."""
    spec = Registry().add(forecast, kind=Kind.READS)
    definition = spec.definition()
    assert definition.description == (
        "Forecast the weather for a place. Use it for any question about future weather."
    )
    place = {
        "type": "object",
        "description": "Where to look.",
        "properties": {
            "city": {"type": "string", "description": "The city's English name."},
            "country": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    assert definition.parameters == {
        "type": "object",
        "properties": {
            "place": {**place, "description": "Where to forecast."},
            "window": {
                "type": "object",
                "properties": {"days": {"type": "integer"}, "hourly": {"type": "boolean"}},
                "required": ["days"],
                "additionalProperties": False,
                "description": "How far ahead, in days.",
            },
            "unit": {
                "enum": ["celsius", "fahrenheit"],
                "type": "string",
                "description": "Temperature unit.",
                "default": "celsius",
            },
            "detail": {"enum": ["brief", "full"], "type": "string", "default": "brief"},
            "filters": {
                "anyOf": [
                    {
                        "type": "object",
                        "description": "Optional narrowing.",
                        "properties": {
                            "min_temp": {"type": "number"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                        "additionalProperties": False,
                    },
                    {"type": "null"},
                ],
                "default": None,
            },
            "limit": {"type": "integer", "description": "At most this many rows.", "default": 10},
            "coords": {
                "anyOf": [
                    {
                        "type": "array",
                        "prefixItems": [{"type": "number"}, {"type": "number"}],
                        "minItems": 2,
                        "maxItems": 2,
                    },
                    {"type": "null"},
                ],
                "default": None,
            },
            "extra": {
                "anyOf": [
                    {"type": "object", "additionalProperties": {"type": "integer"}},
                    {"type": "null"},
                ],
                "default": None,
            },
        },
        "required": ["place", "window"],
        "additionalProperties": False,
    }
    jsonschema.Draft202012Validator.check_schema(definition.parameters)


def test_place_description_from_the_docstring_wins_over_the_class() -> None:
    """A parameter's own docstring words describe it; the class's words stay on the class."""
    parameters = Registry().add(forecast).definition().parameters
    assert parameters["properties"]["place"]["description"] == "Where to forecast."


def test_sphinx_docstrings_describe_parameters() -> None:
    """``:param x:`` lines are read like Google ``Args:`` sections."""

    def lookup(query: str, page: int = 1) -> str:
        """Search the index.

        :param query: Words to look for.
        :param int page: Which page of hits.
        :returns: the hits
        """
        return query * page

    definition = Registry().add(lookup).definition()
    assert definition.description == "Search the index."
    assert definition.parameters["properties"] == {
        "query": {"type": "string", "description": "Words to look for."},
        "page": {"type": "integer", "description": "Which page of hits.", "default": 1},
    }


def test_every_vendor_format_validates_as_the_sdk_param() -> None:
    """The three tools= payloads validate against the SDKs' own param TypedDicts."""
    registry = Registry()
    registry.add(forecast, kind=Kind.READS)
    registry.add(lambda: "pong", name="ping", description="Check the service answers.")
    for tool in registry.anthropic_tools():
        pydantic.TypeAdapter(ToolParam).validate_python(tool, strict=True)
        ToolParam(**tool)
    for chat in registry.openai_tools():
        pydantic.TypeAdapter(ChatCompletionToolParam).validate_python(chat, strict=True)
    for item in registry.responses_tools():
        pydantic.TypeAdapter(FunctionToolParam).validate_python(item, strict=True)
    anthropic_tools = registry.anthropic_tools()
    assert [t["name"] for t in anthropic_tools] == ["forecast", "ping"]
    assert anthropic_tools[1] == {
        "name": "ping",
        "description": "Check the service answers.",
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    assert registry.openai_tools()[1] == {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "Check the service answers.",
            "parameters": anthropic_tools[1]["input_schema"],
        },
    }
    assert registry.responses_tools()[1] == {
        "type": "function",
        "name": "ping",
        "description": "Check the service answers.",
        "parameters": anthropic_tools[1]["input_schema"],
        "strict": False,
    }


def test_a_tool_with_no_description_sends_none_to_any_vendor() -> None:
    """No docstring and no description=: every tools= entry leaves the key out, not empty."""
    registry = Registry()
    registry.add(lambda: "pong", name="ping")
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    assert registry.anthropic_tools() == [{"name": "ping", "input_schema": schema}]
    assert registry.openai_tools() == [
        {"type": "function", "function": {"name": "ping", "parameters": schema}}
    ]
    assert registry.responses_tools() == [
        {"type": "function", "name": "ping", "parameters": schema, "strict": False}
    ]


def test_hand_written_schema_replaces_the_derived_one() -> None:
    """schema= and description= override the hints and the docstring, even unreadable ones."""
    schema = {"type": "object", "properties": {"blob": {"type": "string"}}}
    registry = Registry()

    @registry.tool(schema=schema, description="Store a blob.")
    def store(blob: Opaque) -> None:
        """Ignored."""

    assert registry.anthropic_tools() == [
        {"name": "store", "description": "Store a blob.", "input_schema": schema}
    ]
    assert registry.get("store").bind({"blob": "x"}) == {"blob": "x"}  # type: ignore[union-attr]


def test_hand_written_schema_needs_no_readable_signature() -> None:
    """A tool whose signature cannot be read still has a definition when given schema=."""

    def raw(payload: Any, /) -> None:
        """Take anything."""

    registry = Registry()
    registry.add(raw, schema={"type": "object"})
    assert registry.openai_tools()[0]["function"] == {
        "name": "raw",
        "description": "Take anything.",
        "parameters": {"type": "object"},
    }


@pytest.mark.parametrize(
    ("options", "words"),
    [({"schema": {"type": "string"}}, "arguments object"), ({"name": "has space"}, "1 to 64")],
)
def test_bad_definitions_are_configuration_errors(options: dict[str, Any], words: str) -> None:
    """A schema that is not an object, or a name the APIs reject, is refused with why."""
    registry = Registry()

    def check() -> None:
        registry.add(lambda: None, **{"name": "ok", **options})
        registry.anthropic_tools()

    with pytest.raises(ConfigurationError, match=words):
        check()


class Opaque:
    """A type with no JSON meaning."""


def test_hint_without_json_meaning_names_the_parameter() -> None:
    """A hint JSON cannot describe is a ConfigurationError naming tool, parameter and fix."""

    def upload(blob: Opaque) -> None:
        """Upload."""

    with pytest.raises(ConfigurationError, match=r"'upload', parameter 'blob'.*schema="):
        Registry().add(upload).definition()


def _bound(fn: Any, arguments: dict[str, Any]) -> dict[str, Any] | ArgumentError:
    return bind(read_signature(fn), arguments)


def test_arguments_are_structured_into_their_hints() -> None:
    """attrs classes, dataclasses, enums and tuples arrive as the tool declared them."""
    bound = _bound(
        forecast,
        {"place": {"city": "Oslo"}, "window": {"days": 3.0}, "unit": "fahrenheit",
         "coords": [59.9, 10]},
    )  # fmt: skip
    assert bound == {
        "place": Place("Oslo"),
        "window": Window(3),
        "unit": Unit.FAHRENHEIT,
        "coords": (59.9, 10),
    }


@pytest.mark.parametrize(
    ("arguments", "problems"),
    [
        ({}, ["place: missing (", "window: missing ("]),
        ({"place": {}, "window": {"days": 1}}, ["place.city: missing (a string)"]),
        ({"place": "Oslo", "window": {"days": 1}}, ["place: expected an object, got string"]),
        (
            {"place": {"city": 5}, "window": {"days": "3"}},
            ["place.city: expected a string, got integer",
             "window.days: expected an integer, got string '3'"],
        ),
        (
            {"place": {"city": "a"}, "window": {"days": 1}, "unit": "kelvin", "limit": True},
            ["unit: expected one of 'celsius', 'fahrenheit', got 'kelvin'",
             "limit: expected an integer, got boolean"],
        ),
        (
            {"place": {"city": "a", "zip": 1}, "window": {"days": 1}, "colour": "red"},
            ["place: unknown keys ['zip']", "colour: not an argument of this tool (it takes "],
        ),
        (
            {"place": {"city": "a"}, "window": {"days": 1}, "filters": {"tags": "hot"}},
            ["filters: expected "],
        ),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_argument_and_what_was_expected(
    arguments: dict[str, Any], problems: list[str]
) -> None:
    """Each argument at fault is named with what was expected; nothing is structured."""
    bound = _bound(forecast, arguments)
    assert isinstance(bound, ArgumentError)
    assert len(bound.problems) == len(problems)
    for line, start in zip(bound.problems, problems, strict=True):
        assert line.startswith(start), line


async def test_a_call_that_does_not_fit_is_answered_error_and_not_run() -> None:
    """The turn answers a misfit call error, naming the argument; the tool never runs."""
    ran: list[Place] = []
    registry = Registry()

    @registry.tool(kind=Kind.READS)
    async def visit(place: Place, times: int = 1) -> str:
        ran.append(place)
        return place.city * times

    turn = await Runner(registry).run_turn(
        [
            ToolCall("a", "visit", {"place": {"city": "Rome"}, "times": 2}, 0),
            ToolCall("b", "visit", {"place": {"city": "Rome"}, "times": "2"}, 1),
        ]
    )
    assert ran == [Place("Rome")]
    assert turn.results[0].content == "RomeRome"
    assert turn.results[1].status is Status.ERROR
    assert "\"times: expected an integer, got string '2'" in turn.results[1].content.replace(
        "the arguments do not fit the tool: ", '"'
    )
    assert '"started":false' in turn.results[1].content


# -- the promise: the schema and the binding agree on every JSON value -------------------


def _hashable(hint: Any) -> bool:
    """Whether a union may hold ``hint`` (Python's own unions refuse unhashable metadata)."""
    try:
        hash(hint)
    except TypeError:
        return False
    return True


_SCALAR_HINTS = st.sampled_from([str, int, float, bool, Literal["a", "b", 1], Unit, Any])
_HINTS = st.recursive(
    _SCALAR_HINTS,
    lambda inner: st.one_of(
        inner.map(lambda hint: list[hint]),  # type: ignore[valid-type]
        inner.map(lambda hint: dict[str, hint]),  # type: ignore[valid-type]
        inner.filter(_hashable).map(lambda hint: hint | None),
        st.tuples(inner, inner).map(lambda pair: tuple[pair[0], pair[1]]),  # type: ignore[misc]
        st.just(Place),
        st.just(tuple[()]),
        inner.map(lambda hint: Annotated[hint, {"unit": "cm"}]),  # metadata that is no key
    ),
    max_leaves=6,
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["a", "b", "celsius", "Oslo"]) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["city", "country", "x"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(hint=_HINTS, value=_JSON)
def test_binding_accepts_exactly_what_the_schema_accepts(hint: Any, value: Any) -> None:
    """For any hint and any JSON value, bind succeeds iff the value validates against the schema."""

    def tool(arg: Any) -> None:
        """A tool."""

    tool.__annotations__ = {"arg": hint, "return": None}
    signature = read_signature(tool)
    schema = schema_of(signature, tool="tool")
    valid = jsonschema.Draft202012Validator(schema).is_valid({"arg": value})
    bound = bind(signature, {"arg": value})
    assert isinstance(bound, dict) is valid, (schema, value, bound)


@settings(max_examples=200, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=4) | st.integers(), _JSON, max_size=4))
def test_binding_never_raises(arguments: dict[Any, Any]) -> None:
    """Whatever the model sends, bind returns arguments or an ArgumentError; it never raises."""
    bound = _bound(forecast, arguments)
    assert isinstance(bound, dict | ArgumentError)


def test_public_names() -> None:
    """ArgumentError and ToolDefinition are importable from fanout."""
    assert fanout.ArgumentError is ArgumentError
    assert fanout.ToolDefinition.__name__ == "ToolDefinition"


def test_partials_and_callable_objects_are_read() -> None:
    """A functools.partial hides its bound arguments; a callable object's __call__ is read."""

    class Lookup:
        async def __call__(self, query: str, limit: int = 5) -> str:
            return query * limit

    def search(index: str, query: str) -> str:
        """Search one index."""
        return index + query

    registry = Registry()
    registry.add(functools.partial(search, "books"), name="search_books")
    registry.add(Lookup(), name="lookup")
    books, lookup = registry.definitions()
    assert books.description == "Search one index."
    assert books.parameters["properties"] == {"query": {"type": "string"}}
    assert lookup.parameters["required"] == ["query"]


def test_metadata_other_than_words_is_ignored_by_schema_and_binding() -> None:
    """Annotated metadata that is not a string (a dict, even nested) neither describes
    nor blocks: the schema keeps the words, binding converts as for the bare hint."""

    def measure(sizes: list[Annotated[int, {"unit": "cm"}, "a size"]]) -> None:
        """Measure."""

    signature = read_signature(measure)
    assert schema_of(signature, tool="measure")["properties"]["sizes"] == {
        "type": "array", "items": {"type": "integer", "description": "a size"},
    }  # fmt: skip
    assert bind(signature, {"sizes": [1, 2.0]}) == {"sizes": [1, 2]}
    refused = bind(signature, {"sizes": ["1"]})
    assert isinstance(refused, ArgumentError)
    assert refused.problems == ("sizes[0]: expected an integer, got string '1'",)


def test_the_empty_tuple_binds_only_the_empty_array() -> None:
    """tuple[()] accepts [] and refuses an array with items, saying how many it expected."""

    def nothing(none: tuple[()]) -> None:
        """Nothing."""

    signature = read_signature(nothing)
    assert bind(signature, {"none": []}) == {"none": ()}
    refused = bind(signature, {"none": [1]})
    assert isinstance(refused, ArgumentError)
    assert refused.problems == ("none: expected an array of 0 items, got 1",)


def test_metadata_is_dropped_inside_unions_too() -> None:
    """Annotated[int, 5] | None: the union keeps its members, each without the metadata."""

    def maybe(count: Annotated[int, 5] | None = None) -> None:
        """Maybe."""

    signature = read_signature(maybe)
    assert schema_of(signature, tool="maybe")["properties"]["count"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}], "default": None,
    }  # fmt: skip
    assert bind(signature, {"count": 3}) == {"count": 3}
    assert bind(signature, {"count": None}) == {"count": None}


def test_a_value_json_cannot_hold_is_named_by_its_python_type() -> None:
    """An argument that is no JSON value at all (a set, from code) is named by its type."""

    def count(n: int) -> None:
        """Count."""

    refused = bind(read_signature(count), {"n": {1, 2}})
    assert isinstance(refused, ArgumentError)
    assert refused.problems == ("n: expected an integer, got set",)
