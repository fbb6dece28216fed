"""Federated generation: L data parties vote on their own shards; a server sees only the sum.

`partition` splits a private set for experiments (IID, Dirichlet over labels) or reads one
file per party; `party` is what runs at a data party (its votes plus its noise share);
`flower_secagg` runs the parties and the server on Flower with the SecAgg+ protocol;
`holder` answers a run's releases through the federation (charge before the round, clipping
range, communication accounting); `simulation` connects it to a Flower simulation or deployment;
`clipping` sizes the SecAgg+ clipping range and its delta reserve.
"""
