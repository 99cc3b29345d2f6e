"""troupe.replay against a replay server embedded in the test (replay::Server):
round trips of dense and pixel items, frames sent once, priorities, errors,
the token, and the GIL released while a call blocks."""
import threading
import time

import numpy as np
import pytest

import troupe

TOKEN = "python-test-token-0123456789"


def config(selector="uniform", min_size=1):
    return {"tables": [{
        "name": "transitions", "max_size": 100, "selector": selector,
        "rate_limiter": {"min_size_to_sample": min_size},
        "fields": [
            {"name": "observation", "dtype": "float32", "shape": [3]},
            {"name": "action", "dtype": "int64", "shape": [2]},
            {"name": "pixels", "dtype": "uint8", "shape": [8, 8, 3], "frames": 3},
        ]}]}


def frames(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)


def test_items_round_trip_with_frames_decoded():
    with troupe.replay.Server(config()) as server, troupe.replay.Client(server.address) as client:
        pixels = frames(3, 0)
        client.insert("transitions", {"observation": [1.5, -2, 3], "action": np.array([4, 5]), "pixels": pixels},
                      priority=1.0)
        batch = client.sample("transitions", batch_size=4)
        assert batch.table_size == 1 and batch.keys.dtype == np.uint64 and batch.keys.shape == (4,)
        assert batch.data["observation"].dtype == np.float32
        np.testing.assert_array_equal(batch.data["observation"], [[1.5, -2, 3]] * 4)
        assert batch.data["action"].dtype == np.int64
        np.testing.assert_array_equal(batch.data["action"], [[4, 5]] * 4)
        assert batch.data["pixels"].shape == (4, 3, 8, 8, 3)
        for row in batch.data["pixels"]:
            np.testing.assert_array_equal(row, pixels)
        np.testing.assert_array_equal(batch.weights, np.ones(4, np.float32))
        info = client.info()
        assert info["tables"][0]["config"]["name"] == "transitions" and int(info["tables"][0]["size"]) == 1


def test_a_writer_sends_each_frame_once():
    with troupe.replay.Server(config()) as server:
        client = troupe.replay.Client(server.address)
        pixels = frames(5, 1)
        with client.writer() as writer:
            keys = [writer.append_frame(frame) for frame in pixels]
            # Three stacked items over five frames, sharing frames as a stack does.
            for t in range(3):
                writer.insert("transitions", {"observation": np.full(3, t, np.float32), "action": [t, t],
                                              "pixels": troupe.replay.Frames(keys[t:t + 3])}, priority=1.0)
            writer.flush()
            assert writer.items_sent == 3
            frame_bytes = writer.bytes_sent
        info = client.info()
        assert int(info["frames"]) == 5  # stored once each, not 9
        assert frame_bytes < 3 * pixels[:3].nbytes + 1000
        seen = set()
        for _ in range(10):
            batch = client.sample("transitions", batch_size=8)
            for obs, stack in zip(batch.data["observation"], batch.data["pixels"]):
                t = int(obs[0])
                np.testing.assert_array_equal(stack, pixels[t:t + 3])
                seen.add(t)
        assert seen == {0, 1, 2}


def test_priorities_change_what_is_sampled():
    with troupe.replay.Server(config(selector="prioritized")) as server:
        client = troupe.replay.Client(server.address)
        with client.writer() as writer:
            keys = [writer.append_frame(frame) for frame in frames(3, 2)]
            for t in range(2):
                writer.insert("transitions", {"observation": np.full(3, t, np.float32), "action": [t, t],
                                              "pixels": troupe.replay.Frames(keys)}, priority=1.0)
        batch = client.sample("transitions", batch_size=16)
        key_of = {int(o[0]): int(k) for o, k in zip(batch.data["observation"], batch.keys)}
        assert set(key_of) == {0, 1}
        missing = client.mutate_priorities("transitions", [key_of[0], key_of[1], 123456], [0.0, 1.0, 1.0])
        assert missing == 1
        batch = client.sample("transitions", batch_size=32)
        assert (batch.data["observation"][:, 0] == 1).all()


def test_errors_carry_the_servers_message():
    with troupe.replay.Server(config()) as server:
        client = troupe.replay.Client(server.address)
        with pytest.raises(ValueError, match=r"item 0 \(table 'transitions'\) field 'observation': "
                                             r"expected float32\[3\], got float32\[4\]"):
            client.insert("transitions", {"observation": np.zeros(4), "action": [0, 0], "pixels": frames(3, 3)})
        # The client goes on after a refused item.
        client.insert("transitions", {"observation": np.zeros(3), "action": [0, 0], "pixels": frames(3, 3)})
        assert int(client.info()["tables"][0]["size"]) == 1
        with pytest.raises(LookupError, match="unknown table 'nope'"):
            client.sample("nope", batch_size=1)
        with pytest.raises(ValueError, match="missing fields \\['pixels'\\]"):
            client.writer().insert("transitions", {"observation": np.zeros(3), "action": [0, 0]})
    with pytest.raises(ConnectionError) as error:
        troupe.replay.Client("127.0.0.1:1").info()
    assert isinstance(error.value, troupe.UnavailableError) and error.value.code == "UNAVAILABLE"
    with pytest.raises(ValueError, match="replay config"):
        troupe.replay.Server("tables { bogus: 1 }")


def test_the_token_is_checked():
    with troupe.replay.Server(config(), token=TOKEN) as server:
        with pytest.raises(PermissionError):
            troupe.replay.Client(server.address).info()
        with pytest.raises(PermissionError):
            troupe.replay.Client(server.address, token="another-token-0123456789").info()
        assert troupe.replay.Client(server.address, token=TOKEN).info()["tables"]
    with pytest.raises(ValueError, match="token: 5 characters"):
        troupe.replay.Client("127.0.0.1:1", token="short")


def test_a_blocked_sample_releases_the_gil():
    # The sample blocks on the rate limiter until an item arrives; the insert
    # that unblocks it runs on this thread while the sampler's thread waits
    # in C++: with the GIL held there, this would hang.
    with troupe.replay.Server(config(min_size=1)) as server:
        sampler = troupe.replay.Client(server.address)
        writer_client = troupe.replay.Client(server.address)
        writer_client.info()
        sampler._signature("transitions")
        result = {}
        thread = threading.Thread(target=lambda: result.update(batch=sampler.sample("transitions", 2, timeout=20)))
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive()
        writer_client.insert("transitions", {"observation": np.ones(3), "action": [1, 1], "pixels": frames(3, 4)})
        thread.join(timeout=20)
        assert not thread.is_alive()
        np.testing.assert_array_equal(result["batch"].data["observation"], np.ones((2, 3)))
