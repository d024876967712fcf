"""Helpers of the paired-run benchmark drivers (bench/*/run_*_bench.py)."""
import json
import statistics
import subprocess


def run_json(cmd, env):
    """Runs cmd and returns the JSON object on the last line of its stdout."""
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(values, fmt):
    """'median (min-max)' of values, each formatted with fmt."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"
