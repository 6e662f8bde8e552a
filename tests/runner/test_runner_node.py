"""The runner's JavaScript error parser on what Node really prints for uncaught errors (captured from node)."""
import pytest

from runner_harness import load_runner_module

runner = load_runner_module()


@pytest.mark.parametrize("stderr, expected", [
    pytest.param('/tmp/work/main.js:2\nthrow new TypeError("boom");\n^\n\nTypeError: boom\n    at Object.<anonymous> (/tmp/work/main.js:2:7)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n',
                 ('TypeError', 'boom', 2), id='type-error'),
    pytest.param("/tmp/work/main.js:1\nfunction inner() { null.x; }\n                        ^\n\nTypeError: Cannot read properties of null (reading 'x')\n    at inner (/tmp/work/main.js:1:25)\n    at outer (/tmp/work/main.js:2:20)\n    at Object.<anonymous> (/tmp/work/main.js:3:1)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n",
                 ('TypeError', "Cannot read properties of null (reading 'x')", 1), id='nested-functions'),
    pytest.param("/tmp/work/main.js:1\nlet x = ;\n        ^\n\nSyntaxError: Unexpected token ';'\n    at wrapSafe (node:internal/modules/cjs/loader:1464:18)\n    at Module._compile (node:internal/modules/cjs/loader:1495:20)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n",
                 ('SyntaxError', "Unexpected token ';'", 1), id='syntax-error'),
    pytest.param('\n/tmp/work/main.js:1\nthrow "a string";\n^\na string\n(Use `node --trace-uncaught ...` to show where the exception was thrown)\n\nNode.js v20.20.2\n',
                 ('Uncaught', 'a string', 1), id='thrown-string'),
    pytest.param('/tmp/work/main.js:1\nconst e = new Error("line one\\nline two"); throw e;\n                                           ^\n\nError: line one\nline two\n    at Object.<anonymous> (/tmp/work/main.js:1:11)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n',
                 ('Error', 'line one\nline two', 1), id='multi-line-message'),
    pytest.param("node:fs:573\n  return binding.open(\n                 ^\n\nError: ENOENT: no such file or directory, open '/nope'\n    at Object.openSync (node:fs:573:18)\n    at Object.readFileSync (node:fs:452:35)\n    at Object.<anonymous> (/tmp/work/main.js:1:15)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49 {\n  errno: -2,\n  code: 'ENOENT',\n  syscall: 'open',\n  path: '/nope'\n}\n\nNode.js v20.20.2\n",
                 ('Error', "ENOENT: no such file or directory, open '/nope'", 1), id='error-from-node-internals'),
    pytest.param('/tmp/work/main.js:2\nthrow new MyErr("custom");\n^\n\nMyErr [Error]: custom\n    at Object.<anonymous> (/tmp/work/main.js:2:7)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n',
                 ('MyErr', 'custom', 2), id='custom-class'),
    pytest.param('/tmp/work/main.js:1\nundefinedFn();\n^\n\nReferenceError: undefinedFn is not defined\n    at Object.<anonymous> (/tmp/work/main.js:1:1)\n    at Module._compile (node:internal/modules/cjs/loader:1521:14)\n    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)\n    at Module.load (node:internal/modules/cjs/loader:1266:32)\n    at Module._load (node:internal/modules/cjs/loader:1091:12)\n    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12)\n    at node:internal/main/run_main_module:28:49\n\nNode.js v20.20.2\n',
                 ('ReferenceError', 'undefinedFn is not defined', 1), id='reference-error'),
])
def test_node_uncaught_errors_give_type_message_and_the_line_in_the_code(stderr, expected):
    error = runner.parse_node_error(stderr, "main.js")
    assert (error["type"], error["message"], error["line"]) == expected


def test_output_without_an_uncaught_error_is_no_error():
    assert runner.parse_node_error("", "main.js") is None
    assert runner.parse_node_error("warning: something\nat the end\n", "main.js") is None


def test_the_program_cannot_make_the_parser_report_huge_or_endless_values():
    stderr = "/tmp/work/main.js:" + "9" * 5000 + "\nx\n^\n\n" + "T" * 5000 + ": " + "m" * 20000 + "\n"
    error = runner.parse_node_error(stderr, "main.js")
    assert error is None or (len(error["type"]) <= 1280 and len(error["message"]) <= 5120 and error["line"] is None)
    stderr = "/tmp/work/main.js:3\nx\n^\n\nError: " + "deep\n" * 100000
    assert len(runner.parse_node_error(stderr, "main.js")["message"]) <= 5120


def test_the_parser_is_chosen_by_language():
    assert runner.ERROR_PARSERS["javascript"] is runner.parse_node_error
    assert runner.ERROR_PARSERS["python"] is runner.parse_python_error
