"""A command that ends when the process that started it ends: a sweep's trial (sweep/search.py). A fit left training
on its own after its sweep was killed would hold its trial's run directory and report to the study while another
sweep takes the trial over.

With `EXIT_WITH_PARENT=1` in its environment, the process watches its parent from a thread and SIGKILLs itself, as a
crash would end it, once the parent is gone (it is then re-parented). Its loader workers follow it (PyTorch's workers
end with their parent), and so do the other ranks of its DDP run, each of which watches its own parent, rank 0.
Depends on nothing but the standard library.
"""

import os
import signal
import threading
import time

EXIT_WITH_PARENT = "EXIT_WITH_PARENT"


def exit_with_parent_if_asked(every: float = 0.2) -> None:
    if os.environ.get(EXIT_WITH_PARENT) != "1":
        return
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
