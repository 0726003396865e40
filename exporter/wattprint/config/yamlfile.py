"""The YAML files the exporter reads (--config.file, --web.config.file), read strictly:
a file of any content or size gives back its data or one line saying what is wrong.

Stricter than YAML 1.1 as PyYAML reads it, as exporter-toolkit's strict unmarshalling
is: a key given twice is refused, not won by the last; aliases are refused (a handful
of them expand to gigabytes, the "billion laughs"); nesting is bounded, and so is the
size; keys are their text as written; and only true and false are booleans (YAML 1.2),
so `carbon.zone: NO` is Norway.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from typing import Any

MAX_YAML_BYTES = 1024 * 1024  # a config file is a few hundred bytes
MAX_DEPTH = 32


class YamlFileError(ValueError):
    """str() is one line: what is wrong, and where, without the file's name."""


def load(path: str) -> Any:
    """The file's data; OSError if it cannot be read, YamlFileError if it is not strict YAML."""
    import yaml  # only with a file to read: it costs memory and start-up time

    # Non-blocking, and only a plain file: a FIFO or a device must not hang the start.
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise YamlFileError("is not a file")
        raw = handle.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise YamlFileError(f"is over {MAX_YAML_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlFileError(f"is not UTF-8 text (byte {err.start})") from None
    loader = _strict_loader()(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None)
        said = f": {problem}" if problem else ""
        raise YamlFileError(f"is not valid YAML{at}{said}") from None
    except RecursionError:  # (nesting is bounded below this; kept as a last guard)
        raise YamlFileError(f"is nested deeper than {MAX_DEPTH}") from None
    finally:
        loader.dispose()


@functools.cache
def _strict_loader() -> type:
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class StrictLoader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            mark: Any = event.start_mark  # (libyaml's Mark or PyYAML's: both say the line)
            if isinstance(event, yaml.AliasEvent):
                raise ComposerError(None, None, "aliases (*name) are not allowed", mark)
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH}", mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            if not isinstance(node, yaml.MappingNode):
                raise ConstructorError(None, None, "expected a mapping", node.start_mark)
            mapping: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise ConstructorError(
                        None, None, "a key must be a plain name", key_node.start_mark
                    )
                key = key_node.value
                if key in mapping:
                    raise ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark
                    )
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

    bool_tag = "tag:yaml.org,2002:bool"
    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != bool_tag]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    StrictLoader.add_implicit_resolver(
        bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return StrictLoader
