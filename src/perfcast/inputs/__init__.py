"""Where input enters perfcast: files users write or download (configs, device and topology
YAMLs, profiling databases, caches) and numbers users type. Everything here checks what it
reads where it reads it and turns every problem into a :class:`perfcast.ir.UserError` that
names the file, key or flag and what was expected, quoting at most a short excerpt."""

from perfcast.inputs.json_doc import MAX_JSON_DEPTH, parse_json, read_json
from perfcast.inputs.numbers import checked_number
from perfcast.inputs.problems import problems_error
from perfcast.inputs.text import MAX_TEXT_BYTES, excerpt, read_text
from perfcast.inputs.yamlfile import dump_yaml, load_yaml, parse_yaml

__all__ = ["MAX_JSON_DEPTH", "MAX_TEXT_BYTES", "checked_number", "dump_yaml", "excerpt", "load_yaml", "parse_json",
           "parse_yaml", "problems_error", "read_json", "read_text"]
