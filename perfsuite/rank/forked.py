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
"""

if __name__ == "__main__":
    import os
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if os.environ.pop("PERFSUITE_NVML_CHECK_SET", None):
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
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
        raise SystemExit(code)
    main = __import__(worker, fromlist=["main"]).main
    if set_title is not None:
        set_title([sys.executable, "-m", worker, *sys.argv[1:]])
    raise SystemExit(main())
