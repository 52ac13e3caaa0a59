# docs/examples/test_partition_one_hand.py
"""One Hand of three is partitioned: it is offline, the other two still run commands."""


def test_one_hand_of_three_is_partitioned(mindhand_cluster):
    hands = {n: mindhand_cluster.start_hand(n, proxy=True) for n in ("a", "b", "c")}
    for n in hands:
        mindhand_cluster.wait_connected(n)
    hands["b"].proxy.partition()  # b's link is reset and its reconnects refused
    for n in ("a", "c"):
        r = mindhand_cluster.cli("exec", "--hand", n, "--", "echo", n)
        assert r.returncode == 0 and r.stdout == f"{n}\n".encode()
    r = mindhand_cluster.cli("exec", "--hand", "b", "--", "echo", "b")
    assert r.returncode != 0  # b is offline: refused, not run
