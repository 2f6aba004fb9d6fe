"""The Kubernetes doubles the unit and story tests run on, with their own tests.

apiserver   an emulated API server with the controllers dsx relies on (garbage collector, Job,
            disruption, node lifecycle, pod garbage collector, Event TTL), real HTTP on 127.0.0.1;
            the real ``kubernetes`` client talks to it
kubelet     the node side: kube-scheduler's filters and a kubelet double that runs rank pods as
            processes, reboots nodes in stages and holds nodes down
test_*      the doubles' own behaviour; ``tests/e2e/test_doubles.py`` compares them with a real
            control plane, scenario by scenario
"""
