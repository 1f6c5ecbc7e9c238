"""A rank for the launcher tests; what it does is chosen by argv[1]."""
import os
import signal
import subprocess
import sys
import time

rank = int(os.environ["POOLTENSOR_RANK"])
mode = sys.argv[1]
if mode == "talk":
    print(f"out line of {rank}")
    print(f"err line of {rank}", file=sys.stderr)
    sys.stdout.buffer.write(b"bin \xff\xfe\x00 end\n")
    sys.stdout.write("no newline")
elif mode == "env":
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "COORDINATOR")
    print(" ".join(os.environ.get(f"POOLTENSOR_{k}", "-") for k in keys),
          os.environ.get("EXTRA", "-"), os.environ.get("PMI_RANK", "-"), sys.argv[2:])
elif mode == "exit":  # exit <rank> <code>: that rank exits with code, the others sleep
    if rank == int(sys.argv[2]):
        time.sleep(0.5)  # let the others report their pids first
        sys.exit(int(sys.argv[3]))
    print("sleeping", os.getpid(), flush=True)
    time.sleep(60)
elif mode == "kill":  # the last rank kills itself with SIGKILL
    if rank == int(os.environ["POOLTENSOR_WORLD_SIZE"]) - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
elif mode == "slowok":  # rank 1 fails at once, rank 0 finishes cleanly after a short while
    if rank == 1:
        sys.exit(5)
    time.sleep(0.5)
    print("finished")
elif mode == "stubborn":  # rank 0 fails; the others ignore SIGTERM and start a grandchild
    if rank == 0:
        time.sleep(0.5)
        sys.exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("pids", os.getpid(), child.pid, flush=True)
    time.sleep(60)
elif mode == "selfstop":  # selfstop <rank>: that rank stops itself (SIGSTOP), the others exit 0
    print("pid", os.getpid(), flush=True)
    if rank == int(sys.argv[2]):
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGSTOP)
        print("continued", flush=True)
        time.sleep(60)
elif mode == "sleep":
    print("ready", os.getpid(), flush=True)
    time.sleep(60)
