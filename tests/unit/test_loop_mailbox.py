"""Each event loop has one mailbox, which goes with its loop: a program that starts and stops
servers (each with a loop of its own) keeps none of theirs."""

from __future__ import annotations

import asyncio
import gc
import threading

from tritonfast.runtime import responses


def test_a_mailbox_runs_what_other_threads_post_and_goes_with_its_loop() -> None:
    loop = asyncio.new_event_loop()
    ran: list[int] = []
    mailbox = responses.mailbox_for(loop)
    assert responses.mailbox_for(loop) is mailbox
    posters = [threading.Thread(target=mailbox.post, args=(ran.append, i)) for i in range(8)]
    for poster in posters:
        poster.start()
    for poster in posters:
        poster.join()
    loop.run_until_complete(asyncio.sleep(0))  # one turn of the loop runs them all
    assert sorted(ran) == list(range(8))
    loop.close()
    del loop
    gc.collect()
    assert mailbox not in responses._mailboxes.values()
    mailbox.post(ran.append, 99)  # its loop is gone: nothing runs, nothing fails
    assert 99 not in ran
