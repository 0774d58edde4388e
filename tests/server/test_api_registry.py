"""The API registry: one row per API, and every row whole (handler, versions, fallbacks)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from kio.index import load_request_schema

import oncelog.server
import oncelog.server.handlers
from oncelog.server.api_registry import APIS, Api

HANDLER_MODULES = [
    importlib.import_module(f"oncelog.server.handlers.{info.name}")
    for info in pkgutil.iter_modules(oncelog.server.handlers.__path__)
]


def _handlers_defined() -> set[object]:
    return {
        function
        for module in HANDLER_MODULES
        for name, function in vars(module).items()
        if name.startswith("handle_") and inspect.getmodule(function) is module
    }


def test_every_handler_in_the_handlers_package_answers_an_advertised_api() -> None:
    registered = {api.handler for api in APIS.values()}
    assert _handlers_defined() - registered == set()


def test_every_advertised_api_has_a_coroutine_handler_named_after_it() -> None:
    for api in APIS.values():
        assert inspect.iscoroutinefunction(api.handler), api.name
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", api.name).lower()
        assert api.handler.__name__ == f"handle_{snake}", api.name


def test_every_row_is_keyed_by_its_own_api_key_and_names_are_unique() -> None:
    assert all(key == api.key for key, api in APIS.items())
    assert len({api.name for api in APIS.values()}) == len(APIS)


@pytest.mark.parametrize("api", APIS.values(), ids=lambda api: api.name)
def test_advertised_versions_start_at_zero_and_cover_the_served_ones(api: Api) -> None:
    # librdkafka before 2.11.1 needs ranges from 0 (KAFKA-18659); aiokafka asserts min <= max.
    assert api.advertised[0] == 0 <= api.served[0] <= api.served[1] == api.advertised[1]


@pytest.mark.parametrize("api", APIS.values(), ids=lambda api: api.name)
def test_kio_decodes_every_served_version(api: Api) -> None:
    for version in range(api.served[0], api.served[1] + 1):
        assert load_request_schema(api.key, version) is not None


@pytest.mark.parametrize("api", APIS.values(), ids=lambda api: api.name)
def test_every_advertised_version_below_the_served_ones_has_an_unsupported_version_answer(api: Api) -> None:
    if api.served[0] == 0:
        assert api.unsupported is None  # nothing to refuse: a row holds no dead answer
        return
    assert api.unsupported is not None
    request_class = api.unsupported.request
    for version in range(0, api.served[0]):
        assert api.key == request_class[version].API_KEY
        assert api.key == api.unsupported.response[version].API_KEY


@pytest.mark.parametrize(
    "api", [api for api in APIS.values() if api.fallback_request is not None], ids=lambda api: api.name
)
def test_the_fallback_decoder_is_kafka_pythons_class_of_the_same_api_for_every_served_version(
    api: Api,
) -> None:
    for version in range(api.served[0], api.served[1] + 1):
        request_class = api.fallback_request[version]
        assert api.key == request_class.API_KEY
        assert request_class._class_version == version  # (API_VERSION is an instance property)


def test_the_server_package_docstring_names_every_module_of_the_server() -> None:
    doc = oncelog.server.__doc__ or ""
    folder = Path(oncelog.server.__file__).parent
    modules = {path.stem for path in folder.rglob("*.py") if path.stem != "__init__"}
    modules |= {path.name for path in folder.iterdir() if (path / "__init__.py").exists()}
    assert sorted(name for name in modules if f"`{name}`" not in doc) == []
