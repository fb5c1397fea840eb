"""The owner thread: one event loop on one daemon thread, where every backend call runs.

nnsight's client is not thread-safe, and a served app has many threads (Gradio's workers, a workshop of
thirty browsers). So the engine owns one thread running an event loop; a caller on any other thread
schedules a coroutine (or a plain function) there and waits on the concurrent Future it gets back.

This knows nothing of backends, requests, turns or restarts (`core.py`, `supervisor.py`): it runs what it
is given, and stops with the tasks left on it cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading


class OwnerThread:
    """An event loop running on its own daemon thread, started when made."""

    def __init__(self, name: str = "lens-engine"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, make) -> concurrent.futures.Future:
        """Schedule `make()` (a coroutine factory, or a plain function) on the loop; a concurrent Future."""
        async def run():
            result = make()
            return await result if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def is_running(self) -> bool:
        return self.loop.is_running()

    def stop(self, timeout: float = 30) -> None:
        """Cancel every task left on the loop (a watchdog, calls left waiting), then stop it and join its thread."""
        self.submit(_cancel_tasks).result(timeout=timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout)


async def _cancel_tasks() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(coros) -> list:
    """Every coroutine's result, run at once. When one fails (a stream's reader gone) or this is cancelled, the others
    are cancelled and waited for: nothing of them is left running, holding a slot or counted in flight."""
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
