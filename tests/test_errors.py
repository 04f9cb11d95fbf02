"""Every exception class in the package is in errors.py's tree: derived from CalrouteError and named in its
docstring, so one page says what calroute can raise."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import calroute
from calroute import errors
from calroute.errors import CalrouteError


def exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(calroute.__path__, "calroute."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_class_derives_from_calroute_error() -> None:
    classes = exception_classes()
    assert len(classes) >= 20  # the walk reached the subpackages
    assert [name for name, cls in classes.items() if not issubclass(cls, CalrouteError)] == []


def test_every_exception_class_is_named_in_the_tree() -> None:
    tree = errors.__doc__ or ""
    missing = [name for name, cls in exception_classes().items() if cls.__name__ not in tree]
    assert missing == []
