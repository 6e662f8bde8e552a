"""The runner's JavaScript error parser on what Node really prints for an uncaught error.

Every sample is the stderr of Debian bookworm's node 18.20.4 (the sandbox-node image, in a chroot of its root
filesystem) running `node main.js` in /tmp/work, verbatim; above each, the program (a bash $'...' string).
"""
import json
import shutil

import pytest

from coderun.sandbox.runner.errors import ERROR_PARSERS, V8_HEAP_EXHAUSTED, parse_node_error, parse_python_error
from support.runner import runner_in

# $'console.log(1);\n\nthrow new TypeError("boom");\n'
NODE_TYPE_ERROR = """\
/tmp/work/main.js:3
throw new TypeError("boom");
^

TypeError: boom
    at Object.<anonymous> (/tmp/work/main.js:3:7)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'\nundefinedFn();\n'
NODE_REFERENCE = """\
/tmp/work/main.js:2
undefinedFn();
^

ReferenceError: undefinedFn is not defined
    at Object.<anonymous> (/tmp/work/main.js:2:1)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'function inner() {\n  null.x;\n}\nfunction outer() { inner(); }\nouter();\n'  (the innermost frame in the code file)
NODE_NESTED = """\
/tmp/work/main.js:2
  null.x;
       ^

TypeError: Cannot read properties of null (reading 'x')
    at inner (/tmp/work/main.js:2:8)
    at outer (/tmp/work/main.js:4:20)
    at Object.<anonymous> (/tmp/work/main.js:5:1)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'let a = 1;\nlet x = ;\n'  (at load time: only Node's frames, the header's line)
NODE_SYNTAX = """\
/tmp/work/main.js:2
let x = ;
        ^

SyntaxError: Unexpected token ';'
    at internalCompileFunction (node:internal/vm:76:18)
    at wrapSafe (node:internal/modules/cjs/loader:1283:20)
    at Module._compile (node:internal/modules/cjs/loader:1328:27)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'function f() {\n  return 1;\n\n'  (at the end of the input: no source line, no caret)
NODE_EOF = """\
/tmp/work/main.js:4



SyntaxError: Unexpected end of input
    at internalCompileFunction (node:internal/vm:76:18)
    at wrapSafe (node:internal/modules/cjs/loader:1283:20)
    at Module._compile (node:internal/modules/cjs/loader:1328:27)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'const e = new Error("line one\\nline two");\nthrow e;\n'  (made on line 1, thrown on line 2)
NODE_MULTILINE = """\
/tmp/work/main.js:2
throw e;
^

Error: line one
line two
    at Object.<anonymous> (/tmp/work/main.js:1:11)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'throw new Error("first\\n\\nthird");\n'
NODE_BLANK_LINE_MSG = """\
/tmp/work/main.js:1
throw new Error("first\\n\\nthird");
^

Error: first

third
    at Object.<anonymous> (/tmp/work/main.js:1:7)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'throw new Error();\n'  (no colon)
NODE_EMPTY_MSG = """\
/tmp/work/main.js:1
throw new Error();
^

Error
    at Object.<anonymous> (/tmp/work/main.js:1:7)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'class MyErr extends Error {}\nthrow new MyErr("custom");\n'  (a subclass: `MyErr [Error]: custom`)
NODE_CUSTOM = """\
/tmp/work/main.js:2
throw new MyErr("custom");
^

MyErr [Error]: custom
    at Object.<anonymous> (/tmp/work/main.js:2:7)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'const e = new Error("x"); e.stack = ""; e.code = 7; throw e;\n'  (no stack: `[Type: message] { props }`)
NODE_STACKLESS = """\
/tmp/work/main.js:1
const e = new Error("x"); e.stack = ""; e.code = 7; throw e;
                                                    ^

[Error: x] { code: 7 }

Node.js v18.20.4
"""
# $'throw "a string";\n'  (not an Error: no type, no blank line, a hint)
NODE_STRING = """\

/tmp/work/main.js:1
throw "a string";
^
a string
(Use `node --trace-uncaught ...` to show where the exception was thrown)

Node.js v18.20.4
"""
# $'let x = 1;\nthrow 42;\n'
NODE_NUMBER = """\

/tmp/work/main.js:2
throw 42;
^
42
(Use `node --trace-uncaught ...` to show where the exception was thrown)

Node.js v18.20.4
"""
# $'throw "";\n'
NODE_EMPTY_STRING = """\

/tmp/work/main.js:1
throw "";
^

(Use `node --trace-uncaught ...` to show where the exception was thrown)

Node.js v18.20.4
"""
# $'throw "line1\\nline2";\n'
NODE_MULTILINE_STRING = """\

/tmp/work/main.js:1
throw "line1\\nline2";
^
line1
line2
(Use `node --trace-uncaught ...` to show where the exception was thrown)

Node.js v18.20.4
"""
# $'throw {a: "x".repeat(30), b: "y".repeat(30), c: [1,2,3], d: {e: {f: 1}}};\n'  (a plain object: no hint)
NODE_BIGOBJ = """\

/tmp/work/main.js:1
throw {a: "x".repeat(30), b: "y".repeat(30), c: [1,2,3], d: {e: {f: 1}}};
^
{
  a: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
  b: 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy',
  c: [ 1, 2, 3 ],
  d: { e: { f: 1 } }
}

Node.js v18.20.4
"""
# $'require("fs").readFileSync("/nope");\n'  (thrown inside Node: the header is Node's, the frame the code's)
NODE_INTERNAL = """\
node:internal/fs/utils:356
    throw err;
    ^

Error: ENOENT: no such file or directory, open '/nope'
    at Object.openSync (node:fs:596:3)
    at Object.readFileSync (node:fs:464:35)
    at Object.<anonymous> (/tmp/work/main.js:1:15)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49 {
  errno: -2,
  syscall: 'open',
  code: 'ENOENT',
  path: '/nope'
}

Node.js v18.20.4
"""
# $'require("lodash");\n'
NODE_REQUIRE_MISSING = """\
node:internal/modules/cjs/loader:1143
  throw err;
  ^

Error: Cannot find module 'lodash'
Require stack:
- /tmp/work/main.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1140:15)
    at Module._load (node:internal/modules/cjs/loader:981:27)
    at Module.require (node:internal/modules/cjs/loader:1231:19)
    at require (node:internal/modules/helpers:177:18)
    at Object.<anonymous> (/tmp/work/main.js:1:1)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12) {
  code: 'MODULE_NOT_FOUND',
  requireStack: [ '/tmp/work/main.js' ]
}

Node.js v18.20.4
"""
# $'\nJSON.parse("{bad");\n'  (the header is `undefined:1`)
NODE_JSON = """\
undefined:1
{bad
 ^

SyntaxError: Unexpected token b in JSON at position 1
    at JSON.parse (<anonymous>)
    at Object.<anonymous> (/tmp/work/main.js:2:6)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'\neval("let a = 1;\\nthrow new Error(\'e\')");\n'
NODE_EVAL = """\
undefined:2
throw new Error('e')
^

Error: e
    at eval (eval at <anonymous> (/tmp/work/main.js:2:1), <anonymous>:2:7)
    at Object.<anonymous> (/tmp/work/main.js:2:1)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'async function f() {\n  await null;\n  throw new RangeError("after await");\n}\nf();\n'
NODE_ASYNC = """\
/tmp/work/main.js:3
  throw new RangeError("after await");
        ^

RangeError: after await
    at f (/tmp/work/main.js:3:9)

Node.js v18.20.4
"""
# $'setTimeout(() => {\n  throw new Error("in timer");\n}, 1);\n'
NODE_TIMER = """\
/tmp/work/main.js:2
  throw new Error("in timer");
  ^

Error: in timer
    at Timeout._onTimeout (/tmp/work/main.js:2:9)
    at listOnTimeout (node:internal/timers:569:17)
    at process.processTimers (node:internal/timers:512:7)

Node.js v18.20.4
"""
# $'Promise.reject("nope");\n'  (Node's own error, thrown in Node: no line)
NODE_REJECTION = """\
node:internal/process/promises:288
            triggerUncaughtException(err, true /* fromPromise */);
            ^

[UnhandledPromiseRejection: This error originated either by throwing inside of an async function without a catch block, or by rejecting a promise which was not handled with .catch(). The promise rejected with the reason "nope".] {
  code: 'ERR_UNHANDLED_REJECTION'
}

Node.js v18.20.4
"""
# $'require("fs").writeFileSync("lib.js", "exports.f = function () {\\n  throw new Error(\\"in lib\\");\\n};\\n");\nconst lib = require("./lib.js");\nlib.f();\n'  (thrown in lib.js, called from main.js)
NODE_TWOFILES = """\
/tmp/work/lib.js:2
  throw new Error("in lib");
  ^

Error: in lib
    at exports.f (/tmp/work/lib.js:2:9)
    at Object.<anonymous> (/tmp/work/main.js:3:5)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
    at Module.load (node:internal/modules/cjs/loader:1203:32)
    at Module._load (node:internal/modules/cjs/loader:1019:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
    at node:internal/main/run_main_module:28:49

Node.js v18.20.4
"""
# $'function f() { f(); }\nf();\n'
NODE_STACKOVERFLOW = """\
/tmp/work/main.js:1
function f() { f(); }
               ^

RangeError: Maximum call stack size exceeded
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)
    at f (/tmp/work/main.js:1:16)

Node.js v18.20.4
"""
# $'throw new Error("outer", {cause: new Error("inner")});\n'  (the cause's stack is not the error's)
NODE_CAUSE = """\
/tmp/work/main.js:1
throw new Error("outer", {cause: new Error("inner")});
^

Error: outer
    at Object.<anonymous> (/tmp/work/main.js:1:7)
    at Module._compile (node:internal/modules/cjs/loader:1364:14)
    ... 4 lines matching cause stack trace ...
    at node:internal/main/run_main_module:28:49 {
  [cause]: Error: inner
      at Object.<anonymous> (/tmp/work/main.js:1:34)
      at Module._compile (node:internal/modules/cjs/loader:1364:14)
      at Module._extensions..js (node:internal/modules/cjs/loader:1422:10)
      at Module.load (node:internal/modules/cjs/loader:1203:32)
      at Module._load (node:internal/modules/cjs/loader:1019:12)
      at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:128:12)
      at node:internal/main/run_main_module:28:49
}

Node.js v18.20.4
"""

@pytest.mark.parametrize("stderr, expected", [
    pytest.param(NODE_TYPE_ERROR, ('TypeError', 'boom', 3), id='type-error'),
    pytest.param(NODE_REFERENCE, ('ReferenceError', 'undefinedFn is not defined', 2), id='reference'),
    pytest.param(NODE_NESTED, ('TypeError', "Cannot read properties of null (reading 'x')", 2), id='nested'),
    pytest.param(NODE_SYNTAX, ('SyntaxError', "Unexpected token ';'", 2), id='syntax'),
    pytest.param(NODE_EOF, ('SyntaxError', 'Unexpected end of input', 4), id='eof'),
    pytest.param(NODE_MULTILINE, ('Error', 'line one\nline two', 1), id='multiline'),
    pytest.param(NODE_BLANK_LINE_MSG, ('Error', 'first\n\nthird', 1), id='blank-line-msg'),
    pytest.param(NODE_EMPTY_MSG, ('Error', '', 1), id='empty-msg'),
    pytest.param(NODE_CUSTOM, ('MyErr', 'custom', 2), id='custom'),
    pytest.param(NODE_STACKLESS, ('Error', 'x', 1), id='stackless'),
    pytest.param(NODE_STRING, ('Uncaught', 'a string', 1), id='string'),
    pytest.param(NODE_NUMBER, ('Uncaught', '42', 2), id='number'),
    pytest.param(NODE_EMPTY_STRING, ('Uncaught', '', 1), id='empty-string'),
    pytest.param(NODE_MULTILINE_STRING, ('Uncaught', 'line1\nline2', 1), id='multiline-string'),
    pytest.param(NODE_BIGOBJ, ('Uncaught', "{\n  a: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',\n  b: 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy',\n  c: [ 1, 2, 3 ],\n  d: { e: { f: 1 } }\n}", 1), id='bigobj'),
    pytest.param(NODE_INTERNAL, ('Error', "ENOENT: no such file or directory, open '/nope'", 1), id='internal'),
    pytest.param(NODE_REQUIRE_MISSING, ('Error', "Cannot find module 'lodash'\nRequire stack:\n- /tmp/work/main.js", 1), id='require-missing'),
    pytest.param(NODE_JSON, ('SyntaxError', 'Unexpected token b in JSON at position 1', 2), id='json'),
    pytest.param(NODE_EVAL, ('Error', 'e', 2), id='eval'),
    pytest.param(NODE_ASYNC, ('RangeError', 'after await', 3), id='async'),
    pytest.param(NODE_TIMER, ('Error', 'in timer', 2), id='timer'),
    pytest.param(NODE_REJECTION, ('UnhandledPromiseRejection', 'This error originated either by throwing inside of an async function without a catch block, or by rejecting a promise which was not handled with .catch(). The promise rejected with the reason "nope".', None), id='rejection'),
    pytest.param(NODE_TWOFILES, ('Error', 'in lib', 3), id='twofiles'),
    pytest.param(NODE_STACKOVERFLOW, ('RangeError', 'Maximum call stack size exceeded', 1), id='stackoverflow'),
    pytest.param(NODE_CAUSE, ('Error', 'outer', 1), id='cause'),
])
def test_node_reports_type_message_and_the_line_in_the_code(stderr, expected):
    error = parse_node_error(stderr, "main.js")
    assert (error["type"], error["message"], error["line"]) == expected


def test_stderr_without_an_uncaught_error_is_no_error():
    assert parse_node_error("", "main.js") is None
    assert parse_node_error("warning: something\nat the end\n", "main.js") is None
    # process.exit(3) after console.error: no report, whatever the program printed
    assert parse_node_error("just a message:3\n\n", "main.js") is None
    assert parse_node_error("count:3\nx\n^\n\n\n", "main.js") is None  # a header and caret, nothing after


def test_the_last_report_counts_and_the_program_cannot_fake_a_line_number():
    stderr = "/tmp/work/main.js:1\nx\n^\n\nError: printed by the program\n\n" + NODE_TYPE_ERROR
    assert parse_node_error(stderr, "main.js") == {"type": "TypeError", "message": "boom", "line": 3}
    frame = "    at f (/tmp/work/main.js:" + "9" * 20 + ":1)\n"
    stderr = NODE_TYPE_ERROR.replace("    at Object.<anonymous>", frame + "    at Object.<anonymous>")
    assert parse_node_error(stderr, "main.js")["line"] == 3  # the next frame; int32 and int() bounded


def test_the_program_cannot_make_the_parser_report_huge_values_or_take_long():
    stderr = "/tmp/work/main.js:" + "9" * 5000 + "\nx\n^\n\n" + "T" * 5000 + ": " + "m" * 20000 + "\n"
    assert parse_node_error(stderr, "main.js") is None  # no header: the line number is not a number
    stderr = "/tmp/work/main.js:3\nx\n^\n\n" + "T" * 5000 + ": " + "m" * 20000 + "\n"
    error = parse_node_error(stderr, "main.js")
    assert len(error["type"]) <= 1280 and len(error["message"]) <= 5120 and error["line"] == 3
    error = parse_node_error("/tmp/work/main.js:3\nx\n^\n\nError: " + "deep\n" * 100000, "main.js")
    assert error["type"] == "Error" and len(error["message"]) <= 5120
    for line in ("    at " + "(" * 250000, "    at " + "(a:1:1" * 40000, "1:" * 120000 + "x", " " * 250000 + "^x"):
        assert parse_node_error(NODE_TYPE_ERROR.replace("    at Module.load", line), "main.js")["line"] == 3


def test_the_parser_is_chosen_by_language():
    assert ERROR_PARSERS == {"python": parse_python_error, "javascript": parse_node_error}


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this machine")
def test_the_runner_reports_a_javascript_error(run_runner):
    run = run_runner("console.log('before');\nfunction f(x) {\n  return x.y.z;\n}\nf({});\n",
                     language="javascript", command=["node", "main.js"], codeFile="main.js")
    assert (run.frame["reason"], run.frame["stdout"]) == ("NonZeroExit", "before\n"), run.frame
    assert run.frame["error"] == {"type": "TypeError", "line": 3,
                                  "message": "Cannot read properties of undefined (reading 'z')"}


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this machine")
def test_a_javascript_error_report_printed_by_a_successful_run_is_no_error(run_runner, tmp_path):
    fake = json.dumps(NODE_TYPE_ERROR)  # a JavaScript string literal too
    javascript = dict(language="javascript", command=["node", "main.js"], codeFile="main.js")
    run = run_runner(f'process.stderr.write({fake});\nconsole.log("fine");\n', **javascript)
    assert (run.frame["reason"], run.frame["exitCode"], run.frame["stdout"]) == ("Completed", 0, "fine\n")
    assert run.frame["stderr"] == NODE_TYPE_ERROR and run.frame["error"] is None
    run = runner_in(tmp_path / "failing")(f'process.stderr.write({fake});\nprocess.exit(4);\n', **javascript)
    assert run.frame["reason"] == "NonZeroExit" and run.frame["error"]["type"] == "TypeError"


JAVASCRIPT = dict(language="javascript", command=["node", "main.js"], codeFile="main.js")
MIB = 1048576


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this machine")
def test_node_heap_is_sized_from_the_memory_limit(run_runner, tmp_path):
    code = 'console.log(Math.round(require("v8").getHeapStatistics().heap_size_limit / 1048576));'
    run = run_runner(code, memoryBytes=512 * MIB, **JAVASCRIPT)
    # 80% for the old space, V8's young generation on top: near the limit, where V8's own default (a share of
    # the machine's memory, about half of a pod's) is not
    assert 0.8 * 512 <= int(run.frame["stdout"]) <= 512, run.frame
    default = runner_in(tmp_path / "default")(code, **JAVASCRIPT)  # no memory limit given: V8's own choice
    assert int(default.frame["stdout"]) != int(run.frame["stdout"])
    python = runner_in(tmp_path / "python")("import os; print(os.environ.get('NODE_OPTIONS'))", memoryBytes=512 * MIB)
    assert python.frame["stdout"] == "None\n"  # only Node's environment says so


@pytest.mark.skipif(not shutil.which("node"), reason="no node on this machine")
def test_node_out_of_heap_is_out_of_memory(run_runner, tmp_path):
    run = run_runner("const keep = [];\nwhile (true) keep.push(new Array(100000).fill(1.5));\n",
                     memoryBytes=128 * MIB, **JAVASCRIPT)
    assert (run.frame["reason"], run.frame["signal"], run.frame["oomKilled"]) == ("Signaled", 6, True), run.frame
    assert "JavaScript heap out of memory" in run.frame["stderr"]
    # The same words printed by a program that then fails on its own are only words.
    fake = 'console.error("FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory");'
    run = runner_in(tmp_path / "fake")(fake + "process.exit(1);", memoryBytes=128 * MIB, **JAVASCRIPT)
    assert (run.frame["reason"], run.frame["oomKilled"]) == ("NonZeroExit", False), run.frame
    # V8 failing to get memory for a new isolate (e.g. a flood of worker threads) is out of memory too.
    assert V8_HEAP_EXHAUSTED.search("\n#\n# Fatal process out of memory: Failed to reserve virtual memory\n#\n")
