"""Checking claims numerically: the verifier, certification of claims, and the false-claim fuzzer."""
