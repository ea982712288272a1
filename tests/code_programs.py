"""Programs for the code tests: known-correct and known-wrong solutions of the shipped sample problems
(stapo_trl/code/samples/eurus_code.jsonl, in file order; correct under PRIME's rules, the reward's), and hostile
programs.

Each hostile program's name says what it attempts; the sandbox tests check that it is contained.
"""

CORRECT = [
    "a, b = map(int, input().split())\nprint(a + b)\n",
    "import sys\nlines = sys.stdin.read().split()\nn = int(lines[0])\nprint('\\n'.join(reversed(lines[1 : n + 1])))\n",
    "import sys\nnumbers = list(map(int, sys.stdin.read().split()))\nprint(max(numbers), min(numbers))\n",
    "def add(a, b):\n    return a + b\n",
    "class Solution:\n"
    "    def twoSum(self, nums, target):\n"
    "        seen = {}\n"
    "        for j, x in enumerate(nums):\n"
    "            if target - x in seen:\n"
    "                return [seen[target - x], j]\n"
    "            seen[x] = j\n",
    "def is_palindrome(s):\n    return s == s[::-1]\n",
]

WRONG = [
    "a, b = map(int, input().split())\nprint(a - b)\n",  # wrong from the first test
    "import sys\nlines = sys.stdin.read().split()\nprint('\\n'.join(lines[1:]))\n",  # right on the last test only
    "numbers = list(map(int, input().split()))\nprint(max(numbers), max(numbers))\n",  # right on the second only
    "def add(a, b):\n    return a * b\n",  # right on no test (1*2 != 3)
    "class Solution:\n    def twoSum(self, nums, target):\n        return (0, 1)\n",  # right on the 1st and 3rd
    "def is_palindrome(s):\n    return True\n",  # wrong on the second test
]

# What each attempts, as a program reading nothing and printing "escaped" if the attempt worked.
HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    "allocate_10_gb": "block = bytearray(10 * 1024**3)\nprint('escaped')\n",
    "print_1_gb": "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
    "write_1_gb_raw": "import os\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    os.write(1, chunk)\n",
    "sleep_forever": "import time\ntime.sleep(10**6)\n",
    "detached_sleeper": (  # leaves a process behind in a new session, outside the program's process group
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(10**6)\nprint('parent done')\n"
    ),
}


def write_outside(path: str) -> str:
    return f"open({path!r}, 'w').write('escaped')\nprint('escaped')\n"


def connect_to(port: int) -> str:
    return (
        "import socket\n"
        f"connection = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "connection.sendall(b'escaped')\n"
        "print('escaped')\n"
    )


def kill(pid: int) -> str:
    """Kills its parent, then the given process (the trainer's pid, as seen from outside), then process group."""
    return (
        "import os, signal\n"
        "for attempt in (lambda: os.kill(os.getppid(), signal.SIGKILL),\n"
        f"                lambda: os.kill({pid}, signal.SIGKILL),\n"
        f"                lambda: os.killpg(os.getpgid({pid}), signal.SIGKILL),\n"
        "                lambda: os.kill(-1, signal.SIGKILL)):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError:\n"
        "        pass\n"
        "print('still here')\n"
    )


def read_environment(pid: int) -> str:
    """Prints its own environment and every /proc/<pid>/environ it can read, the trainer's among them."""
    return (
        "import os\n"
        "print(dict(os.environ))\n"
        f"for pid in [{pid}, 1] + [name for name in os.listdir('/proc') if name.isdigit()]:\n"
        "    try:\n"
        "        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
