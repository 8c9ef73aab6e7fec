"""weir's murmur2 (``app.engine.produce``) gives aiokafka's value for every key: a record batch goes to the partition
a ``send()`` of the same key would have chosen (Kafka's default partitioner, the Java client's too)."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from weir.app.engine.produce import murmur2


@given(st.binary(max_size=80))
def test_murmur2_is_aiokafka_s(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data)


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_the_partition_is_the_default_partitioner_s(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert partitions[(murmur2(key) & 0x7FFFFFFF) % count] == DefaultPartitioner()(key, partitions, partitions)


def test_known_values_of_the_java_client() -> None:
    # org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed ints there)
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536, b"a-little-bit-longer-string": -1486304829}
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF
