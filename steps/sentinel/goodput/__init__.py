"""Goodput: what a fleet loses to faults and what each policy wins back.

The report of what a fleet lost, read back from the ledger, node marks and Events
(:mod:`.ledger_report`; :mod:`.plot`, :mod:`.metrics`, and :mod:`.keep`, the step of ``dsx-goodput``),
and the fleet-lifetime simulation (:mod:`.simulate`) over a fault rate table (:mod:`.rates`, data in
``recipes/goodput/``). It lives under the sentinel because goodput reads the sentinel's ledger of node
states; like every part of the sentinel it imports only ``steps.cluster`` and the top-level helpers.
"""
