"""Programs the runner tier (tests/runner) and the cluster's (e2e) both run in a session: one text, two tiers."""

# What a run can do to the interpreter it was forked as (a module's function, sys.modules, sys.path, the
# collector), and to every process it can name but its namespace's init (killing that ends the run's namespace, as
# it would cold); it prints the PIDs it sees and its capabilities (CapInh, CapPrm, CapEff, CapAmb).
TAMPER = ("import gc, json, os, signal, sys\n"
          "json.dumps = None\nsys.modules['planted'] = object()\nsys.path.insert(0, '/planted')\ngc.disable()\n"
          "seen = sorted(p for p in os.listdir('/proc') if p.isdigit())\n"
          "for pid in range(2, 400):\n"
          "    if pid != os.getpid():\n"
          "        try:\n            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
          "caps = {line.split()[1] for line in open('/proc/self/status')\n"
          "        if line.startswith(('CapInh', 'CapPrm', 'CapEff', 'CapAmb'))}\n"
          "print(seen, caps)\n")
TAMPERED = "['1', '2'] {'0000000000000000'}\n"
# What the next run sees of it: nothing.
AFTER_TAMPERING = ("import gc, json, sys\n"
                   "print(json.dumps([1]), 'planted' in sys.modules, '/planted' in sys.path, gc.isenabled())\n")
UNTOUCHED = "[1] False False True\n"
