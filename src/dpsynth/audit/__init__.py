"""Empirical privacy audit (`dpsynth audit`): what an attacker can learn about planted canaries from a run's output.

Every epsilon dpsynth prints is an upper bound that holds only if the code is right. The audit
plants canaries in the private data (each included or held out by a fair coin), runs the method as
configured, scores every canary with membership signals computed from the synthetic output alone,
and turns the guesses into a one-run lower bound on epsilon (Steinke, Nasr and Jagielski, 2023). A
lower bound above the claimed epsilon means the run leaks more than it says.
"""
