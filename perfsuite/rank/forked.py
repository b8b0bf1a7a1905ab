"""A rank that torchrun's agent forks rather than starts as a fresh interpreter.

    python -m torch.distributed.run ... --start-method=fork --run-path <this file> --cell-file F --out DIR

torchrun runs this file (``runpy.run_path``) in each rank it forked from an
agent that a zygote forked (perfsuite.launch.zygote). The rank then looks as a
fresh interpreter would to the worker (perfsuite.rank.worker.main): the
signal handlers Python starts with, not the agent's (which turn SIGTERM into
an exception); the thread count of ``OMP_NUM_THREADS`` (a fresh torch reads
it when it loads; the forked one loaded earlier under another value); its own
command line in ps. It imports nothing at module level but under
``__main__``, and only the worker of the interpreter that runs it.

Where the agent had asked CUDA anything before it forked (another torchrun,
a user's environment), CUDA cannot start in this process: the rank then
runs the worker in a fresh interpreter of its own (same environment and
output, its exit status passed on), and says so in its output.

What else it takes from a fresh interpreter (docs/explanation/failures.md,
"What forked ranks promise"): its random state (``reseed``: torch's and
numpy's from the OS, as a fresh interpreter's; Python's ``random`` reseeds
itself after a fork), a ``sys.stdin`` on the same /dev/null (``fresh_stdin``),
and its end: once its record is written the rank ends as an exec'd one does
(``os._exit``: threads it left are not joined, nor its multiprocessing
children, and no atexit handler runs), where multiprocessing's own end would
join them (``end_as_exec``). A process the workload forks holds none of the
pipes and sockets the rank was started with (``inherited_pipes``): the
agent waits for the rank's end on one, and a child still holding it kept
the launch waiting after the rank had ended.
"""


def reseed() -> None:
    """Seed torch's default generator and numpy's global one from the OS, as
    a fresh interpreter's are: every rank forked from one zygote would
    otherwise draw what the zygote would have drawn next."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.random.default_generator.seed()  # CPU only: CUDA's are seeded as CUDA starts
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    import random

    random.seed()


def fresh_stdin() -> None:
    """``sys.stdin`` (and ``sys.__stdin__``) as a fresh interpreter makes it,
    on file descriptor 0: multiprocessing closed the agent's and put one on
    another descriptor in its place."""
    import io
    import os
    import sys

    old = sys.__stdin__ or sys.stdin
    try:
        os.fstat(0)
    except OSError:  # closed: what an exec'd rank would have
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
    if sys.stdin is not None and sys.stdin is not old:
        try:
            replaced = sys.stdin.fileno()
            sys.stdin.close()
            if replaced > 2:
                os.close(replaced)
        except (OSError, ValueError):
            pass
    buffer = open(0, "rb", closefd=False)  # noqa: SIM115 - lives with the process
    buffer.raw.name = "<stdin>"
    stream = io.TextIOWrapper(buffer, encoding=getattr(old, "encoding", None), errors=getattr(old, "errors", None),
                              newline="\n")
    stream.mode = "r"
    sys.stdin = sys.__stdin__ = stream


def inherited_pipes():
    """A function that, in a process forked from this one, puts /dev/null in
    place of every pipe and socket open now (the agent's: the sentinel on
    which it waits for the rank's end, its queues, its rendezvous store);
    what the rank opens later stays. /dev/null, not a close: the numbers stay
    taken, so an object that still holds one closes nothing of the child's."""
    import os
    import stat

    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            info = os.fstat(fd)
        except OSError:  # the listing's own descriptor
            continue
        if fd > 2 and (stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode)):
            found[fd] = (info.st_dev, info.st_ino)

    def close() -> None:
        null = os.open(os.devnull, os.O_RDWR)
        for fd, seen in found.items():
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) == seen:
                    os.dup2(null, fd, inheritable=False)
            except OSError:
                continue
        os.close(null)

    return close


def end_as_exec(code: int) -> None:
    """From here on, the end of multiprocessing's process (once torchrun's
    agent has the rank's return value) is ``os._exit(code)`` as in an exec'd
    rank (perfsuite.rank.worker): no join of the threads or multiprocessing
    children the workload left, which waited for ever."""
    import multiprocessing.util
    import os
    import sys
    import threading

    def end(*args, **kwargs) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)

    multiprocessing.util._exit_function = end
    threading._shutdown = end

if __name__ == "__main__":
    import os
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.register_at_fork(after_in_child=inherited_pipes())
    fresh_stdin()
    if os.environ.pop("PERFSUITE_NVML_CHECK_SET", None):
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    reseed()
    try:
        from perfsuite.system.title import set_title
    except ImportError:  # another interpreter's perfsuite, older than this file
        set_title = None
    from importlib.util import find_spec

    # an older perfsuite's layout (an A/B side from a git ref) had perfsuite.worker
    worker = "perfsuite.rank.worker" if find_spec("perfsuite.rank") else "perfsuite.worker"
    def uses_cuda(argv: list[str]) -> bool:
        """Whether this rank's cell runs on CUDA (its --cell-file says)."""
        import json

        try:
            cell_file = argv[argv.index("--cell-file") + 1]
            with open(cell_file, encoding="utf-8") as f:
                return json.load(f).get("device") == "cuda"
        except (ValueError, IndexError, OSError):
            return False  # the worker will say what is wrong with its arguments

    bad_fork = getattr(torch._C, "_cuda_isInBadFork", None)
    # A CPU rank never starts CUDA: a poisoned fork costs it nothing (on a
    # machine without NVML torchrun's check poisons it all the same).
    if bad_fork is not None and bad_fork() and uses_cuda(sys.argv):
        # Not exec in place: torchrun waits for a forked rank's return value on
        # a queue only this process can fill. The fresh worker dies with this
        # process (its parent-death signal) and gets its SIGTERM.
        import subprocess

        print(f"perfsuite: rank {os.environ.get('RANK')}: its torchrun agent had initialised CUDA before it "
              "forked this rank; running it in a fresh interpreter instead", file=sys.stderr, flush=True)
        fresh = subprocess.Popen([sys.executable, "-m", worker, *sys.argv[1:]], env=dict(os.environ))
        signal.signal(signal.SIGTERM, lambda signum, frame: fresh.send_signal(signum))
        code = fresh.wait()
        if code < 0:  # killed: so is this rank, as the agent would have seen it
            if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two no handler can hold
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        end_as_exec(code)
        raise SystemExit(code)
    main = __import__(worker, fromlist=["main"]).main
    if set_title is not None:
        set_title([sys.executable, "-m", worker, *sys.argv[1:]])
    code = main()
    end_as_exec(code)
    raise SystemExit(code)
