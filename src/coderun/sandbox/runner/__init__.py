"""The sandbox runner, PID 1 of every sandbox container: it runs one untrusted program as a child under the
sandbox's limits, measures it, collects its artifacts and prints exactly one framed JSON result line
(`CODERUN-RESULT-V1 {...}`), then writes a digest of that frame to the termination log so the operator can tell
the real frame from a forged one.

Standard library only, one module a job: `protocol` (the wire: the only module the operator imports), `inputs`,
`capture`, `processes`, `limits`, `confinement`, `seccomp`, `child`, `errors`, `artifacts`, `frame`, and `main`,
which runs them in order. This file imports nothing, so importing the protocol costs the operator nothing more.
"""
