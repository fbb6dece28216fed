"""The data holder: the only code (with the federated parties) that reads private records.

`dataset` loads and checks the private records; `holder` answers a method's requests
(votes on candidates, histograms) by charging the run's ledger, computing on the records
and adding noise, and returns only the noisy result; `releases` keeps every noisy result
the moment it is released, so a resumed run never draws a release twice.
"""
