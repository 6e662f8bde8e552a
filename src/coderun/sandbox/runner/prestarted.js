// The program's own Node process, started before its code arrives (prestart.py, the runner's side; prestarted.py
// is Python's): the runner starts `node -r THIS_FILE /tmp/work/main.js` in / under the program's confinement
// (namespaces, rlimits and syscall filter in place before Node runs) with the environment every run gets. Node
// runs a `--require` preload once its own start is done and before it looks for the main module, so this file
// waits here, blocking, for the runner's word (the run's environment; its code file is in the work dir by then),
// moves to the work dir, answers with the CPU time spent so far (the run's metrics count only the program's own),
// and returns. Node then runs main.js through its own entry point, as `node main.js` there would: the stack of an
// uncaught error, the argv, exit codes and signals are a cold run's.
//
// Nothing of this stays for the program to see: the channel is closed, the variable that named it is gone with
// the rest of the start's environment, process.execArgv is a cold start's (empty: the heap size comes in
// NODE_OPTIONS), and this file leaves the module caches. A worker thread, which runs its parent's preloads too,
// only cleans up the same way (a program that names a channel in its environment names none for it).
'use strict';

const fs = require('fs');
const Module = require('module');
const path = require('path');
const { isMainThread } = require('worker_threads');

const FD_VARIABLE = 'CODERUN_PRESTART_FD';
const MAX_WORD_BYTES = 1024 * 1024; // the run's environment: the spec's env is bounded far below this

// The runner's word: one line of JSON {"env": {...}}; null when the channel ends first (the runner gave this
// process up) or the word is too long.
function receiveWord(fd) {
  const chunks = [];
  const buffer = Buffer.alloc(65536);
  let size = 0;
  for (;;) {
    const count = fs.readSync(fd, buffer, 0, buffer.length, null);
    if (count === 0 || size + count > MAX_WORD_BYTES) {
      return null;
    }
    chunks.push(Buffer.from(buffer.subarray(0, count)));
    size += count;
    if (buffer[count - 1] === 0x0a) {
      return JSON.parse(Buffer.concat(chunks).toString('utf8'));
    }
  }
}

function takeRun(fd) {
  const word = receiveWord(fd);
  if (word === null) {
    process.exit(0);
  }
  // The run's environment, in its order (process.env writes through to the C environment).
  for (const name of Object.keys(process.env)) {
    delete process.env[name];
  }
  Object.assign(process.env, word.env);
  // Started in the image's root (prestart.py: nothing of /tmp is read before the run), it runs from the work dir,
  // as `node main.js` there would: argv[1] is named from the work dir as Node names it (its real path).
  process.chdir(path.dirname(process.argv[1]));
  process.argv[1] = path.resolve(process.cwd(), path.basename(process.argv[1]));
  const usage = process.cpuUsage();
  fs.writeSync(fd, `${((usage.user + usage.system) / 1e6).toFixed(6)}\n`);
  fs.closeSync(fd);
}

// `-r THIS_FILE`, which a cold start's execArgv does not have (a worker's copies its parent's first one). Named
// as the runner named it: Node's __filename is that path with its links resolved.
function isThisFile(path) {
  try {
    return fs.realpathSync(path) === __filename;
  } catch {
    return false;
  }
}

function forgetPreloadOption() {
  const at = process.execArgv.findIndex((arg, i) => i > 0 && ['-r', '--require'].includes(process.execArgv[i - 1])
                                                    && isThisFile(arg));
  if (at > 0) {
    process.execArgv.splice(at - 1, 2);
  }
}

if (isMainThread && process.env[FD_VARIABLE] !== undefined) {
  takeRun(Number(process.env[FD_VARIABLE]));
}
forgetPreloadOption();
delete require.cache[__filename];
for (const [request, filename] of Object.entries(Module._pathCache || {})) {
  if (filename === __filename) {
    delete Module._pathCache[request];
  }
}
