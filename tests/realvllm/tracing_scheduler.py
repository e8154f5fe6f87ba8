"""vLLM's own V1 scheduler, unchanged, writing down what it decides (for the differential test).

Loaded inside the vLLM engine process with ``--scheduler-cls tracing_scheduler.TracingScheduler``
(this folder on ``PYTHONPATH``). Every method calls vLLM's and only observes the state before and
after, appending one JSON line per event to the file named by ``ROLLOUT_ROUTER_SCHED_TRACE``:

* ``add``: a request entered the waiting queue after ``step`` engine steps (its prompt length and
  first tokens identify it to the test);
* ``step``: engine step ``step`` admitted these requests (with the prefix-cache hit vLLM gave each and
  the tokens it asked the cache about), preempted these, and scheduled this many tokens;
* ``done``: the requests that finished with step ``step``'s output, and when.

This file imports vLLM, so only vLLM's virtualenv can import it; the project's tests read the trace.
"""
from __future__ import annotations

import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

HEAD_TOKENS = 8  # prompt tokens written per request, enough to tell sessions apart


class TracingScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._trace = open(os.environ["ROLLOUT_ROUTER_SCHED_TRACE"], "a", buffering=1)

    def _write(self, **event) -> None:
        self._trace.write(json.dumps(event) + "\n")

    def add_request(self, request) -> None:
        super().add_request(request)
        self._write(ev="add", step=self.current_step, id=request.request_id, t=time.monotonic(),
                    prompt_len=len(request.prompt_token_ids),
                    head=list(request.prompt_token_ids[:HEAD_TOKENS]))

    def schedule(self, *args, **kwargs):
        t0 = time.monotonic()
        before = {r.request_id for r in self.running}
        waiting = {r.request_id: (r.num_preemptions, r.num_tokens) for r in self.waiting}
        output = super().schedule(*args, **kwargs)
        running = [r.request_id for r in self.running]
        sched = dict(output.num_scheduled_tokens)
        admitted = []
        for rid in running:
            if rid in waiting:
                preemptions, num_tokens = waiting[rid]
                hit = self.requests[rid].num_computed_tokens - sched[rid]
                admitted.append([rid, hit, num_tokens, preemptions > 0])
        preempted = [r.request_id for r in self.waiting if r.request_id in before]
        context = sum(self.requests[rid].num_computed_tokens for rid in sched)  # after this step
        self._write(ev="step", step=self.current_step, t=t0, admitted=admitted, preempted=preempted,
                    tokens=sum(sched.values()), seqs=len(sched), context=context)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        running = list(self.running)
        result = super().update_from_output(scheduler_output, model_runner_output)
        finished = [r.request_id for r in running if r.is_finished()]
        self._write(ev="done", step=self.current_step, t=time.monotonic(), finished=finished)
        return result
