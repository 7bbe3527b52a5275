"""The Python package over the C API (python/ckptdb; docs/python.md): bit-exact round trips from
every kind of buffer, lazy capture that keeps the caller's buffer alive, errors that carry the C
API's message and change nothing, and the ctypes mirror of the C structures.

Run by ctest (`python_package`) with CKPTDB_LIBRARY and CKPTDB_STRUCT_LAYOUT set; by hand:
    CKPTDB_LIBRARY=build/libckptdb.so PYTHONPATH=python python3 -m unittest discover python/tests
"""

import array
import ctypes
import gc
import os
import random
import shutil
import subprocess
import tempfile
import unittest

import ckptdb
from ckptdb import _capi


def pattern(n: int, seed: int) -> bytearray:
    return bytearray(random.Random(seed).getrandbits(8) for _ in range(n))


class StoreTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckptdb-test-", dir="/dev/shm")
        self.root = os.path.join(self.dir, "root")
        self.tiers = "tmpfs:" + os.path.join(self.dir, "t1")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def open(self, **kw) -> ckptdb.Store:
        return ckptdb.Store(self.root, tiers=self.tiers, chunk_bytes=64 << 10,
                            staging_bytes=1 << 20, **kw)

    def test_every_kind_of_buffer_round_trips_bit_for_bit(self):
        data = {
            "bytearray": pattern(300_000 + 17, 1),
            "bytes": bytes(pattern(70_000, 2)),
            "memoryview": memoryview(pattern(4096 * 3, 3)),
            "array": array.array("d", (float(i) * 0.5 for i in range(10_000))),
            "empty": bytearray(),
        }
        with self.open() as store:
            for name, buf in data.items():
                store.put_shard(1, name, buf)
            store.commit(1)
            self.assertEqual(store.latest(), 1)
            for name, buf in data.items():
                want = bytes(memoryview(buf).cast("B")) if len(memoryview(buf)) else b""
                out = bytearray(len(want))
                store.restore(1, name, out)
                self.assertEqual(bytes(out), want, name)
            # Into a slice of a larger buffer, and into an array.
            big = bytearray(400_000)
            store.restore(1, "bytearray", memoryview(big)[100:100 + len(data["bytearray"])])
            self.assertEqual(big[100:100 + len(data["bytearray"])], data["bytearray"])
            out = array.array("d", bytes(len(data["array"]) * 8))
            store.restore(1, "array", out)
            self.assertEqual(out, data["array"])

    def test_dtype_and_shape_are_recorded_and_listed(self):
        with self.open() as store:
            store.put_shard(3, "w", pattern(2 * 3 * 4, 9), dtype="f32", shape=(2, 3))
            store.put_shard(3, "raw", pattern(10, 10))
            store.commit(3)
            listed = {t.name: t for t in store.list(3)}
        self.assertEqual(sorted(listed), ["raw", "w"])
        self.assertEqual(listed["w"].dtype, "f32")
        self.assertEqual(listed["w"].shape, (2, 3))
        self.assertEqual(listed["w"].nbytes, 24)
        self.assertIsNone(listed["w"].global_shape)
        self.assertEqual(listed["raw"].dtype, "raw")

    def test_lazy_capture_holds_the_buffer_until_it_is_done(self):
        with self.open() as store:
            want = bytes(pattern(256 << 10, 4))
            buf = bytearray(want)
            store.put_shard(1, "w", buf)  # capture reads it later
            ref = memoryview(buf)
            del buf
            gc.collect()
            self.assertTrue(store._pinned.get(1), "the Store keeps the buffer for capture")
            store.wait_capture(1)
            self.assertFalse(store._pinned.get(1), "released once capture is done")
            ref[:] = bytes(len(ref))  # the caller's again: changing it changes nothing
            store.commit(1)
            out = bytearray(len(want))
            store.restore(1, "w", out)
            self.assertEqual(bytes(out), want)

    def test_reopen_sees_what_was_committed(self):
        with self.open() as store:
            store.put_shard(5, "w", pattern(1000, 5), copy_now=True)
            store.commit(5)
            store.put_shard(6, "w", pattern(1000, 6), copy_now=True)  # never committed
        with self.open() as store:
            self.assertEqual(store.latest(), 5)
            out = bytearray(1000)
            store.restore(5, "w", out)
            self.assertEqual(out, pattern(1000, 5))
            with self.assertRaises(ckptdb.StateError) as e:
                store.restore(6, "w", out)
            self.assertIn("6", str(e.exception))

    def test_errors_carry_the_c_message_and_change_nothing(self):
        with self.open() as store:
            self.assertIsNone(store.latest())
            store.put_shard(1, "w", pattern(100, 1), copy_now=True)
            with self.assertRaises(ckptdb.ExistsError) as e:
                store.put_shard(1, "w", pattern(100, 2), copy_now=True)
            self.assertEqual(e.exception.status, -3)
            self.assertIn("'w'", e.exception.message)
            store.commit(1)
            with self.assertRaises(ckptdb.NotFound) as e:
                store.restore(9, "w", bytearray(100))
            self.assertIn("9", str(e.exception))
            with self.assertRaises(ckptdb.SizeError):
                store.restore(1, "w", bytearray(99))
            with self.assertRaises(ckptdb.StateError):
                store.put_shard(1, "x", pattern(10, 3))  # versions increase
            # Refused before the C API is called.
            with self.assertRaises(TypeError):
                store.restore(1, "w", bytes(100))  # read-only
            with self.assertRaises(ValueError):
                store.put_shard(2, "strided", memoryview(pattern(100, 4))[::2])
            with self.assertRaises(TypeError):
                store.put_shard(2, "w", 12345)
            with self.assertRaises(ValueError):
                store.put_shard(2, "bad\0name", pattern(10, 5))
            with self.assertRaises(ValueError):
                store.put_shard(2, "w", pattern(10, 5), dtype="complex128")
            out = bytearray(100)
            store.restore(1, "w", out)
            self.assertEqual(out, pattern(100, 1), "the failures changed nothing")
        with self.assertRaises(ckptdb.InvalidError) as e:
            ckptdb.Store(self.root, tiers="nonsense:/x")
        self.assertIn("nonsense", str(e.exception))

    def test_the_device_option_reaches_the_store(self):
        # "sim" opens (host buffers go the host way); an unknown device is refused, naming it.
        with self.open(device="sim") as store:
            store.put_shard(1, "w", pattern(100, 1))
            store.commit(1)
            out = bytearray(100)
            store.restore(1, "w", out)
            self.assertEqual(out, pattern(100, 1))
        with self.assertRaises(ckptdb.InvalidError) as e:
            self.open(device="tpu")
        self.assertIn("tpu", str(e.exception))

    def test_versions_outside_64_bits_are_refused_not_wrapped(self):
        # ctypes wraps a Python int modulo 2**64: 2**64 + 7 used to commit version 7, and -1
        # reached the reserved CKPTDB_ALL_VERSIONS.
        with self.open() as store:
            for bad in (2**64 + 7, -1, 2**64 - 1, 2**70):
                with self.assertRaises(ckptdb.InvalidError) as e:
                    store.put_shard(bad, "w", pattern(10, 1), copy_now=True)
                self.assertIn(str(bad), str(e.exception))
                for call in (store.commit, store.abort, store.wait_capture, store.list):
                    with self.assertRaises(ckptdb.InvalidError):
                        call(bad)
                with self.assertRaises(ckptdb.InvalidError):
                    store.restore(bad, "w", bytearray(10))
            for bad in (True, 7.0, "7", None):
                with self.assertRaises(TypeError):
                    store.put_shard(bad, "w", pattern(10, 1), copy_now=True)
            self.assertIsNone(store.latest(), "nothing was put by the refused calls")
            store.put_shard(0, "w", pattern(10, 2), copy_now=True)  # 0 is a version
            store.commit(0)
            store.put_shard(2**64 - 2, "w", pattern(10, 3), copy_now=True)
            store.commit(2**64 - 2)
            self.assertEqual(store.latest(), 2**64 - 2)

    def test_put_shards_puts_a_batch_in_one_call_all_or_nothing(self):
        import torch  # noqa: PLC0415 - Debian's python3-torch, as the torch tests use

        with self.open() as store:
            tensors = [torch.arange(i, dtype=torch.float32).reshape(1, i) for i in range(1, 301)]
            bufs = [pattern(i, 100 + i) for i in range(0, 200, 7)]
            shards = [(f"t{i}", t) for i, t in enumerate(tensors)]
            shards += [(f"b{i}", b) for i, b in enumerate(bufs)]
            shards.append(("placed", torch.ones(2, 3), (4, 3), (2, 0)))
            store.put_shards(4, shards)
            self.assertTrue(store._pinned.get(4), "the lazily put buffers are held")
            store.wait_capture(4)
            store.commit(4)
            listed = {t.name: t for t in store.list(4)}
            self.assertEqual(len(listed), len(shards))
            self.assertEqual(listed["t7"].dtype, "f32")
            self.assertEqual(listed["t7"].shape, (1, 8))
            self.assertEqual(listed["b3"].dtype, "raw")
            self.assertEqual(listed["placed"].global_shape, (4, 3))
            self.assertEqual(listed["placed"].global_offset, (2, 0))
            for i in (0, 99, 299):
                out = torch.empty(1, i + 1)
                store.restore(4, f"t{i}", out)
                self.assertTrue(torch.equal(out, tensors[i]))
            out = bytearray(len(bufs[5]))
            store.restore(4, "b5", out)
            self.assertEqual(out, bufs[5])
            # A refusal names the shard's index, and nothing of the call is put.
            bad = [("x0", pattern(10, 1)), ("x1", pattern(10, 2)), ("x0", pattern(10, 3))]
            with self.assertRaises(ckptdb.ExistsError) as e:
                store.put_shards(5, bad, copy_now=True)
            self.assertIn("shard 2 of 3", e.exception.message)
            with self.assertRaises(ValueError):
                store.put_shards(5, [("ok", pattern(4, 1)), ("bad\0name", pattern(4, 2))])
            with self.assertRaises(ValueError):
                store.put_shards(5, [("ok", pattern(4, 1), (8,))])
            store.put_shards(5, [("x0", pattern(10, 4))], copy_now=True)
            store.put_shards(5, [], copy_now=True)
            store.commit(5)
            self.assertEqual([t.name for t in store.list(5)], ["x0"])

    def test_a_closed_store_refuses_calls(self):
        store = self.open()
        store.close()
        store.close()  # twice is fine
        with self.assertRaises(ckptdb.StateError):
            store.latest()


    def test_close_from_another_thread_waits_for_the_puts_inside_the_handle(self):
        # Issue 40: a put runs with the GIL released; a close on another thread used to free the
        # handle under it. Now the close waits, and the puts after it raise StateError.
        import threading
        data = bytearray(4 << 20)
        for round_ in range(5):
            store = self.open()
            errors, puts = [], [0]
            started = threading.Event()

            def putter():
                started.set()
                try:
                    for i in range(1000):
                        store.put_shard(1, f"t{i}", data, copy_now=True)
                        puts[0] += 1
                except ckptdb.StateError:
                    pass
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            thread = threading.Thread(target=putter)
            thread.start()
            started.wait()
            store.close()
            thread.join()
            self.assertEqual(errors, [], f"round {round_}")
            with self.assertRaises(ckptdb.StateError):
                store.put_shard(1, "after", data)
            # The version the putter left open was aborted by the close: nothing committed.
            with self.open() as again:
                self.assertIsNone(again.latest())


class LayoutTest(unittest.TestCase):
    def test_the_dtype_names_are_the_libraries(self):
        for name, code in ckptdb.DTYPES.items():
            self.assertEqual(_capi._dtype_name(code).decode(), name)
        self.assertEqual(_capi._dtype_name(len(ckptdb.DTYPES)).decode(), "?")

    def test_the_ctypes_structures_match_the_header(self):
        tool = os.environ.get("CKPTDB_STRUCT_LAYOUT")
        if not tool:
            self.skipTest("CKPTDB_STRUCT_LAYOUT (the struct_layout tool) is not set")
        lines = subprocess.run([tool], check=True, capture_output=True, text=True).stdout.split()
        facts = dict(zip(lines[0::2], (int(v) for v in lines[1::2])))
        checked = 0
        for c_name, mirror in _capi.STRUCTURES.items():
            self.assertEqual(ctypes.sizeof(mirror), facts[c_name], c_name)
            for field, _type in mirror._fields_:
                self.assertEqual(getattr(mirror, field).offset, facts[f"{c_name}.{field}"],
                                 f"{c_name}.{field}")
                checked += 1
        self.assertEqual(checked, len(facts) - len(_capi.STRUCTURES),
                         "every field the header has is mirrored")
        # The batched put packs the same two structures with struct: the same sizes and offsets.
        self.assertEqual(_capi._SHARD_PACK.size, facts["ckptdb_shard"])
        self.assertEqual(_capi._INFO_PACK.size, facts["ckptdb_tensor_info"])
        self.assertEqual(_capi._GLOBAL_SHAPE_AT, facts["ckptdb_tensor_info.global_shape"])
        self.assertEqual(_capi._GLOBAL_OFFSET_AT, facts["ckptdb_tensor_info.global_offset"])


if __name__ == "__main__":
    unittest.main()
