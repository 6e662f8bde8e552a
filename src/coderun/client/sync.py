"""CodeRunClient: create a CodeRun, wait for it with a watch, read the typed result. The SDK's only I/O module."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ..api.models import GROUP, PLURAL, VERSION, CodeRunSpec, InputRef, Limits
from .connection import connect
from .creating import create_plan
from .data import AUTH_FAILURES, DATA_URL_ENV, fetch, refused, save, send_uploads
from .deleting import delete_plan
from .errors import CodeRunError, RunNotFound, RunRejected, raise_if_rejected, refused_inputs, upload_failed_for
from .inputs import (UPLOAD_RUN_CODE, FileSource, Upload, input_refs, split_files, upload_of_inline, with_inputs,
                     with_kept)
from .request import (DEFAULT_NAME_PREFIX, SELF_SUBJECT_REVIEW, RunRequest, build_body, creator_of_review,
                      label_selector, unstated_if_forbidden, verdict_patch)
from .artifacts import artifact_bytes, find_artifact
from .result import RunResult, result_from_object, results_from_list
from .runtimes import RuntimeInfo, runtimes_plan
from .steps import Create, Delete, Fetch, FetchAll, Get, GetPolicy, OpenWatch, Sleep, Step, drive
from ..api.coderunpolicy import POLICY_PLURAL
from ..api.coderunsession import SESSION_PLURAL, CodeRunSessionSpec
from .sessions import (SESSION_READY_WAIT_SECONDS, SessionEnded, SessionInfo, SessionNotReady, batch_labels,
                       batch_requests, batch_wait_seconds, build_session_body, refused_as_ended, run_in_session_spec,
                       settled, why_over, session_info, session_spec)
from .waiting import (API_REQUEST_TIMEOUT, DEFAULT_WAIT_SECONDS, DEFAULT_WATCH_SECONDS, WaitStats, api_failures,
                      default_wait_seconds, fetched, listed_items, run_wait_seconds, settled_by, upload_settled,
                      wait_all_outcome, wait_all_plan, wait_outcome, wait_plan)

__all__ = ["CodeRunClient", "default_wait_seconds", "raise_if_rejected"]  # the last two: for the CLI and tests

_NETWORK_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class CodeRunClient:
    """Runs code through coderun from a kubeconfig or in-cluster.

    >>> client = CodeRunClient()
    >>> client.run("print(6*7)").stdout
    '42\\n'

    `run` raises PolicyDenied / RunRejected when the operator refused the run and RunTimeout when the caller's
    wait ran out; a program that failed (non-zero exit, its own Timeout, OOMKilled) is a normal RunResult.
    """

    def __init__(self, namespace: str | None = None, *, kubeconfig: str | None = None, context: str | None = None,
                 api_client: client.ApiClient | None = None, client_name: str = "sdk",
                 watch_seconds: float = DEFAULT_WATCH_SECONDS, data_url: str | None = None):
        if api_client is None:
            api_client, default_namespace = connect(kubeconfig, context)
        else:
            default_namespace = "default"
        self.namespace = namespace or default_namespace
        self.client_name = client_name
        self.watch_seconds = watch_seconds
        # Where to reach the data service instead of the address a run's status names (docs/data.md).
        self.data_url = data_url or os.environ.get(DATA_URL_ENV) or None
        self._api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._creator: dict[str, str] | None = None

    # ---- the one call an agent needs
    def run(self, code: str, language: str = "python", *,
            files: Mapping[str, FileSource] | list | None = None,
            inputs: Sequence[InputRef | Mapping[str, Any]] | None = None,
            stdin: str | None = None, limits: Limits | Mapping[str, Any] | None = None,
            timeout: int | None = None, wait: bool = True, wait_timeout: float | None = None,
            namespace: str | None = None, labels: Mapping[str, str] | None = None,
            on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """Run `code` and return its result. `timeout` is the program's own limit in seconds (reason Timeout
        when exceeded); `wait_timeout` bounds the caller's wait (RunTimeout when exceeded; default: the
        program's limit plus 360 s, past the operator's own bound on a sandbox that cannot start). `files` maps
        sandbox paths to text, bytes, a pathlib.Path or an open binary file, of any size the policy allows: small
        ones go in the spec, larger ones are uploaded to the data service (streamed from disk) once the run asks
        for them. `inputs`: inputs by reference (an S3 object, an earlier run's artifact: artifact_input()).
        wait=False returns once the uploads are sent, without waiting for the result."""
        inline, uploads = split_files(files, code=code, stdin=stdin)
        request = RunRequest(code=code, language=language, files=inline or None, stdin=stdin, timeout=timeout)
        return self.submit(request, limits=limits, inputs=inputs, uploads=uploads, wait=wait,
                           wait_timeout=wait_timeout, namespace=namespace, labels=labels, on_update=on_update)

    def submit(self, request: RunRequest, *, limits: Limits | Mapping[str, Any] | None = None,
               inputs: Sequence[InputRef | Mapping[str, Any]] | None = None, uploads: Sequence[Upload] = (),
               wait: bool = True, wait_timeout: float | None = None, namespace: str | None = None,
               labels: Mapping[str, str] | None = None,
               on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """`run` for a ready RunRequest (what the MCP tool and the agent hold). A run whose uploads fail is deleted
        (nothing else would send its bytes) and the failure raised (UploadFailed, InputTooLarge)."""
        spec = with_inputs(request.to_spec(limits), input_refs(inputs), uploads)
        created = self.create(spec, namespace=namespace, labels=labels)
        wait_seconds = run_wait_seconds(spec, wait_timeout)
        if uploads:
            try:
                created = self.send_uploads(created, uploads, timeout=wait_seconds, on_update=on_update)
            except RunRejected:
                raise  # refused by the operator: kept, as any refused run
            except CodeRunError as e:
                self.delete(created.name, namespace=created.namespace)
                raise upload_failed_for(e, created.name)
        if not wait:
            return created
        result = self.wait(created.name, namespace=created.namespace, timeout=wait_seconds, on_update=on_update)
        return raise_if_rejected(result)

    def send_uploads(self, created: RunResult, uploads: Sequence[Upload], *, timeout: float = DEFAULT_WAIT_SECONDS,
                     on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """Wait until the run says where to upload (status.upload; at most `timeout` seconds, else RunTimeout),
        then upload what it waits for, streamed; the run as last seen. Nothing is sent when the run needs nothing
        (the store holds the bytes already) or ended first."""
        if not uploads:
            return created
        seen = self.wait(created.name, namespace=created.namespace, timeout=timeout, on_update=on_update,
                         until=upload_settled)
        if seen.upload is not None:
            send_uploads(seen.upload, uploads, self.data_url)
        return refused_inputs(seen)

    # ---- the building blocks
    def create(self, spec: CodeRunSpec | RunRequest, *, namespace: str | None = None,
               labels: Mapping[str, str] | None = None, name: str | None = None,
               name_prefix: str = DEFAULT_NAME_PREFIX,
               inputs: Sequence[InputRef | Mapping[str, Any]] | None = None) -> RunResult:
        """Create the CodeRun (a unique name chosen here unless `name` is given); returns it without a status.
        A create refused with 429 or 5xx, or left unanswered, is retried without ever making two runs.
        `inputs`: inputs by reference added to the spec's."""
        if isinstance(spec, RunRequest):
            spec = spec.to_spec()
        spec = with_inputs(spec, input_refs(inputs))
        body = build_body(spec, client_name=self.client_name, labels=labels, name=name, name_prefix=name_prefix,
                          creator=self.creator())
        return self._own(result_from_object(drive(create_plan(body), self._performer(namespace or self.namespace))))

    def get(self, name: str, *, namespace: str | None = None) -> RunResult:
        obj = self._call(f"get CodeRun {name}", self._custom.get_namespaced_custom_object,
                         GROUP, VERSION, namespace or self.namespace, PLURAL, name)
        return self._own(result_from_object(obj))

    def wait(self, name: str, *, namespace: str | None = None, timeout: float = DEFAULT_WAIT_SECONDS,
             on_update: Callable[[RunResult], None] | None = None, stats: WaitStats | None = None,
             until: Callable[[Mapping[str, Any] | None], bool] | None = None) -> RunResult:
        """Block until the run is finished (any terminal phase, Rejected included) and return it; RunTimeout
        when `timeout` seconds pass first. Uses a watch that is resumed after it drops. `until`: wait for this
        state of the CodeRun object instead."""
        namespace = namespace or self.namespace
        started = time.monotonic()
        notify = (lambda obj: on_update(result_from_object(obj))) if on_update else None
        last, finished = drive(wait_plan(name, started + timeout, max_watch_seconds=self.watch_seconds,
                                         on_update=notify, stats=stats, until=until),
                               self._performer(namespace), self._watcher(namespace))
        return self._own(wait_outcome(name, namespace, time.monotonic() - started, last, finished))

    def wait_for(self, name: str, predicate: Callable[[RunResult], bool], *, namespace: str | None = None,
                 timeout: float = DEFAULT_WAIT_SECONDS) -> RunResult:
        """The run once `predicate(run)` holds, or once it finished (it changes no more: check what you waited
        for); RunTimeout when `timeout` seconds pass first. E.g. `wait_for(name, lambda r: r.reason ==
        "WaitingForUpload")`."""
        return self.wait(name, namespace=namespace, timeout=timeout, until=settled_by(predicate))

    def wait_all(self, names: Iterable[str], *, namespace: str | None = None, timeout: float = DEFAULT_WAIT_SECONDS,
                 labels: Mapping[str, str] | None = None, stats: WaitStats | None = None) -> list[RunResult]:
        """`wait` for many of this client's runs at once, over one watch of them (those `labels` select, when
        given): the runs in the order named. RunTimeout for the first still unfinished when `timeout` passes;
        RunNotFound for a run not among them (created by another client: `wait` for it)."""
        names, namespace = list(names), namespace or self.namespace
        started = time.monotonic()
        last = drive(wait_all_plan(names, label_selector(self.client_name, labels, True), started + timeout,
                                   max_watch_seconds=self.watch_seconds, stats=stats),
                     self._performer(namespace), self._watcher(namespace))
        return [self._own(r) for r in wait_all_outcome(names, namespace, time.monotonic() - started, last)]

    def list(self, *, namespace: str | None = None, labels: Mapping[str, str] | None = None,
             mine: bool = False, all_namespaces: bool = False) -> list[RunResult]:
        """Runs, oldest first; `labels` filters by label equality, `mine` by this client's coderun.io/client."""
        selector = label_selector(self.client_name, labels, mine)
        if all_namespaces:
            listed = self._call("list CodeRuns", self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                label_selector=selector)
        else:
            listed = self._call("list CodeRuns", self._custom.list_namespaced_custom_object, GROUP, VERSION,
                                namespace or self.namespace, PLURAL, label_selector=selector)
        return [self._own(r) for r in results_from_list(listed)]

    def delete(self, name: str, *, namespace: str | None = None, missing_ok: bool = True) -> bool:
        """Delete the run (its pod, ConfigMaps and artifacts go with it). False when it was already gone."""
        return drive(delete_plan(name, missing_ok=missing_ok), self._performer(namespace or self.namespace))

    def decide(self, name: str, approve: bool, *, namespace: str | None = None) -> RunResult:
        """Approve (or reject) a run waiting for approval, as this client's identity: needs the RBAC verb approve
        on coderuns; a creator's own approval counts only where the policy allows it. The run as patched."""
        obj = self._call(f"{'approve' if approve else 'reject'} CodeRun {name}",
                         self._custom.patch_namespaced_custom_object, GROUP, VERSION, namespace or self.namespace,
                         PLURAL, name, verdict_patch(self.creator(), approve))
        return self._own(result_from_object(obj))

    def artifact(self, result: RunResult, name: str, path: str | Path | None = None) -> Any:
        """The bytes of one artifact the program wrote to $CODERUN_OUTPUT_DIR, small (in a ConfigMap) or stored
        (streamed from the data service) alike, checked against the size and sha256 the run recorded
        (ArtifactUnavailable when they differ). With `path`: written there, streamed, and that Path returned; a
        file whose bytes do not match is not left behind."""
        artifact = find_artifact(result, name)
        if not artifact.stored:
            configmap = self._call(f"read ConfigMap {artifact.config_map}", self._core.read_namespaced_config_map,
                                   artifact.config_map, result.namespace)
            data = artifact_bytes(artifact, configmap.binary_data)
            return data if path is None else save(path, data)
        got = fetch(result.data_grant, result.name, artifact, path, self.data_url)
        if not isinstance(got, (bytes, Path)) and got.status in AUTH_FAILURES:  # a grant read long ago: read anew
            got = fetch(self.get(result.name, namespace=result.namespace).data_grant, result.name, artifact, path,
                        self.data_url)
        if isinstance(got, (bytes, Path)):
            return got
        raise refused(result.name, artifact, got)

    def artifacts(self, result: RunResult) -> dict[str, bytes]:
        return {a.name: self.artifact(result, a.name) for a in result.artifacts or ()}

    def runtimes(self, namespace: str | None = None, policy: str | None = None) -> list[RuntimeInfo]:
        """What a run in the namespace gets: the CodeRunPolicy named `policy`, else the namespace's `default`,
        else the built-in baseline (the same selection the operator makes)."""
        return drive(runtimes_plan(policy), self._performer(namespace or self.namespace))

    # ---- sessions: many runs, one sandbox (docs/sessions.md)
    def session(self, language: str = "python", *, policy: str | None = None, keep_state: bool = False,
                limits: Limits | Mapping[str, Any] | None = None, idle_timeout: int | None = None,
                max_lifetime: int | None = None, namespace: str | None = None,
                labels: Mapping[str, str] | None = None, name: str | None = None) -> Session:
        """Create a CodeRunSession and return it; use it as `with client.session() as s: s.run(...)` so it is
        deleted (its pod with it) when the block ends. Files the runs write in the working directory stay for
        the session's next runs; `limits` (memory, cpu, disk) are the sandbox's for the whole session."""
        return self.create_session(session_spec(language, policy=policy, keep_state=keep_state, limits=limits,
                                                idle_timeout=idle_timeout, max_lifetime=max_lifetime),
                                   namespace=namespace, labels=labels, name=name)

    def create_session(self, spec: CodeRunSessionSpec, *, namespace: str | None = None,
                       labels: Mapping[str, str] | None = None, name: str | None = None) -> Session:
        """`session` for a ready CodeRunSessionSpec (what the CLI builds)."""
        namespace = namespace or self.namespace
        body = build_session_body(spec, client_name=self.client_name, labels=labels, name=name,
                                  creator=self.creator())
        created = self._call("create CodeRunSession", self._custom.create_namespaced_custom_object,
                             GROUP, VERSION, namespace, SESSION_PLURAL, body)
        return Session(self, created["metadata"]["name"], namespace, spec.language)

    def open_session(self, name: str, *, namespace: str | None = None) -> Session:
        """A session that exists already (created by this identity: only its creator may run in it)."""
        return Session(self, name, namespace or self.namespace)

    def creator(self) -> dict[str, str]:
        """Who this client is, as the API server knows it (a SelfSubjectReview, asked once): the creator every run
        and session it creates states, which the API server checks (coderun/api/identity.py)."""
        if self._creator is None:
            try:
                review = self._call("learn this client's identity (SelfSubjectReview)",
                                    client.AuthenticationV1Api(self._api_client).create_self_subject_review,
                                    SELF_SUBJECT_REVIEW)
            except CodeRunError as e:
                self._creator = unstated_if_forbidden(e)
            else:
                self._creator = creator_of_review(review)
        return self._creator

    # ---- API plumbing
    def _own(self, result: RunResult) -> RunResult:
        """The result, able to read its artifacts through this client (result.artifact(name))."""
        result._reader = self.artifact
        return result

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with _api_failures(what):
            return fn(*args, _request_timeout=API_REQUEST_TIMEOUT, **kwargs)

    def _performer(self, namespace: str) -> Callable[[Step], Any]:
        """Performs a plan's steps (steps.py) in `namespace`."""
        def perform(step: Step) -> Any:
            if isinstance(step, Create):
                return self._call("create CodeRun", self._custom.create_namespaced_custom_object,
                                  GROUP, VERSION, namespace, PLURAL, step.body)
            if isinstance(step, Get):
                return self._call(f"get CodeRun {step.name}", self._custom.get_namespaced_custom_object,
                                  GROUP, VERSION, namespace, PLURAL, step.name)
            if isinstance(step, Delete):
                return self._call(f"delete CodeRun {step.name}", self._custom.delete_namespaced_custom_object,
                                  GROUP, VERSION, namespace, PLURAL, step.name, propagation_policy="Background")
            if isinstance(step, GetPolicy):
                return self._call(f"get CodeRunPolicy {step.name}", self._custom.get_namespaced_custom_object,
                                  GROUP, VERSION, namespace, POLICY_PLURAL, step.name)
            if isinstance(step, Fetch):
                with _api_failures(f"list CodeRun {step.name}", waiting=True):
                    listed = self._custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={step.name}",
                        _request_timeout=API_REQUEST_TIMEOUT)
                return fetched(listed)
            if isinstance(step, FetchAll):
                with _api_failures(f"list CodeRuns {step.labels}", waiting=True):
                    listed = self._custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, label_selector=step.labels,
                        _request_timeout=API_REQUEST_TIMEOUT)
                return listed_items(listed)
            assert isinstance(step, Sleep), step
            time.sleep(step.seconds)
        return perform

    def _watcher(self, namespace: str) -> Callable[[OpenWatch], Iterator[tuple[str, Mapping[str, Any]]]]:
        def watch_from(step: OpenWatch) -> Iterator[tuple[str, Mapping[str, Any]]]:
            watcher = watch.Watch()
            try:
                with _api_failures(f"watch CodeRun {step.name}", waiting=True):
                    for event in watcher.stream(
                            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                            **step.selector(), resource_version=step.resource_version,
                            allow_watch_bookmarks=True, timeout_seconds=max(1, int(step.seconds)),
                            # A connection that goes silent is noticed instead of hanging past the deadline.
                            _request_timeout=(API_REQUEST_TIMEOUT, step.seconds + 10)):
                        yield event["type"], event["object"]
            finally:
                watcher.stop()
        return watch_from


def _api_failures(what: str, *, waiting: bool = False):
    return api_failures(what, ApiException, _NETWORK_ERRORS, waiting=waiting)


class Session:
    """One CodeRunSession: its runs go one at a time through its sandbox, in the order they are created."""

    def __init__(self, client: CodeRunClient, name: str, namespace: str, language: str | None = None):
        self.client, self.name, self.namespace = client, name, namespace
        self._language = language  # read from the session's spec at the first run when not given
        self.uploaded: dict[str, Upload] = {}  # what upload() sent: every later run has it at its path

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.delete()

    @property
    def language(self) -> str:
        if self._language is None:
            self._language = self._object()["spec"]["language"]
        return self._language

    def run(self, code: str, *, files: Mapping[str, FileSource] | list | None = None,
            inputs: Sequence[InputRef | Mapping[str, Any]] | None = None, stdin: str | None = None,
            timeout: int | None = None, wait: bool = True, wait_timeout: float | None = None,
            labels: Mapping[str, str] | None = None,
            on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """CodeRunClient.run in this session's sandbox (the session's language, limits and policy). Raises
        SessionEnded when the session has ended, RunRejected when the run was refused otherwise. A large file
        sent again in a later run is not uploaded again: the store keeps it by its sha256."""
        inline, uploads = split_files(files, code=code, stdin=stdin)
        return self.submit(RunRequest(code=code, language=self.language, files=inline or None, stdin=stdin,
                                      timeout=timeout),
                           inputs=inputs, uploads=uploads, wait=wait, wait_timeout=wait_timeout, labels=labels,
                           on_update=on_update)

    def upload(self, files: Mapping[str, FileSource] | list, timeout: int | None = None) -> RunResult:
        """Upload once, use in every later run: the files (any size the policy allows; a Path is streamed) go to
        the store and into the session's sandbox now, by a run of no code, whose result (its status.inputs: path,
        size, sha256) is returned; every later run of this session finds them at their paths, read-only, with
        nothing sent or fetched again. Raises as a run does (UploadFailed, InputTooLarge, SessionEnded)."""
        inline, uploads = split_files(files, code=UPLOAD_RUN_CODE)
        everything = uploads + [upload_of_inline(f) for f in inline]
        result = self.submit(RunRequest(code=UPLOAD_RUN_CODE, language=self.language, timeout=timeout),
                             uploads=everything)
        if result.phase == "Succeeded":
            self.uploaded.update({u.path: u for u in everything})
        return result

    def submit(self, request: RunRequest, *, inputs: Sequence[InputRef | Mapping[str, Any]] | None = None,
               uploads: Sequence[Upload] = (), wait: bool = True, wait_timeout: float | None = None,
               labels: Mapping[str, str] | None = None,
               on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """`run` for a ready RunRequest (what the agent loop holds); its memory and cpu must be unset."""
        uploads = with_kept(uploads, self.uploaded)
        spec = with_inputs(run_in_session_spec(request, self.name), input_refs(inputs), uploads)
        created = self._create(spec, labels)
        wait_seconds = run_wait_seconds(spec, wait_timeout)
        if uploads:
            try:
                created = self.client.send_uploads(created, uploads, timeout=wait_seconds, on_update=on_update)
            except RunRejected:
                raise  # refused by the operator: kept, as any refused run
            except CodeRunError as e:
                self.client.delete(created.name, namespace=self.namespace)
                raise upload_failed_for(e, created.name)
        if not wait:
            return created
        result = self.client.wait(created.name, namespace=self.namespace, timeout=wait_seconds, on_update=on_update)
        over = self.why_over() if refused_as_ended(result) else None
        if over is not None:
            raise over
        return raise_if_rejected(result)

    def map(self, programs: Iterable[str | RunRequest], *, timeout: int | None = None,
            wait_timeout: float | None = None, labels: Mapping[str, str] | None = None) -> list[RunResult]:
        """Run each program (code in the session's language, or a RunRequest) in the session, in the order given,
        as an evaluation harness does: all created at once (they go one at a time, in that order), then waited
        for over one watch. The results in that order, each as it ended: a run refused (the session ended on the
        way: reason SessionEnded) is a result too, not raised. `timeout`: each code's own limit; `wait_timeout`:
        the whole batch's wait, else every run's limit in turn plus start-up."""
        requests, tagged = batch_requests(programs, self.language, timeout), batch_labels(labels)
        specs = [run_in_session_spec(request, self.name) for request in requests]  # all refused before any is made
        names = [self._create(spec, tagged).name for spec in specs]
        return self.client.wait_all(names, namespace=self.namespace, labels=tagged,
                                    timeout=batch_wait_seconds(requests, wait_timeout))

    def _create(self, spec: CodeRunSpec, labels: Mapping[str, str] | None) -> RunResult:
        try:
            return self.client.create(spec, namespace=self.namespace, labels=labels)
        except CodeRunError:
            over = self.why_over()  # the API server refuses a run naming an ended session: say how it ended
            if over is not None:
                raise over from None
            raise

    def info(self) -> SessionInfo:
        """Where the session stands: phase, reason, pod, runs done, when it expires."""
        return session_info(self._object())

    def wait_ready(self, timeout: float = SESSION_READY_WAIT_SECONDS, poll_seconds: float = 0.25) -> SessionInfo:
        """Wait until the session takes runs and return where it stands; SessionEnded when it ended instead (its
        policy refused it, its sandbox could not start: the reason and message say which), SessionNotReady when
        `timeout` passed first. The default outlasts the operator's own bound on a sandbox that does not start."""
        started = time.monotonic()
        while True:
            info = self.info()
            if settled(info):
                if info.ended:
                    raise SessionEnded(info)
                return info
            waited = time.monotonic() - started
            if waited >= timeout:
                raise SessionNotReady(info, waited)
            time.sleep(min(poll_seconds, timeout - waited))
            poll_seconds = min(poll_seconds * 2, 2.0)

    def why_over(self) -> CodeRunError | None:
        """Why the session takes no more runs (ended, or deleted), or None while it lives."""
        try:
            info = self.info()
        except RunNotFound:
            info = None
        return why_over(info, self.namespace, self.name)

    def delete(self) -> bool:
        """End the session now (its pod goes with it). False when it was already gone."""
        try:
            self.client._call(f"delete CodeRunSession {self.name}", self.client._custom.delete_namespaced_custom_object,
                              GROUP, VERSION, self.namespace, SESSION_PLURAL, self.name,
                              propagation_policy="Background")
            return True
        except RunNotFound:
            return False

    def _object(self) -> dict[str, Any]:
        return self.client._call(f"get CodeRunSession {self.name}", self.client._custom.get_namespaced_custom_object,
                                 GROUP, VERSION, self.namespace, SESSION_PLURAL, self.name)
