"""`shared_memory.launch`: a tile launch that asks for more shared memory than the device has (Triton's
OutOfResources, raised before anything runs) runs with fewer pipeline stages, down to one; the count
that launched is kept for the next launch of the same kernel and settings. A stand-in kernel refuses
stages past what its "device" takes, as Triton does on a card with less shared memory per block."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from gufo.kernels.triton import shared_memory  # noqa: E402


class Refusing:
    """kernel[grid](...): refuses more than `fits` stages; records each launch's stages and settings."""

    def __init__(self, fits: int) -> None:
        self.fits, self.launches = fits, []

    def __getitem__(self, grid):
        def run(*args, num_stages, **settings):
            if num_stages > self.fits:
                raise OutOfResources(num_stages * 49152, self.fits * 49152, "shared memory")
            self.launches.append((grid, args, num_stages, settings))

        return run


@pytest.mark.parametrize("fits,want", [(3, 3), (2, 2), (1, 1)])
def test_a_launch_keeps_the_stages_that_fit(fits, want):
    kernel = Refusing(fits)
    shared_memory.launch(kernel, (4,), "x", num_stages=3, BLOCK_M=128, num_warps=8)
    assert kernel.launches == [((4,), ("x",), want, {"BLOCK_M": 128, "num_warps": 8})]
    kernel.fits = 0  # a later launch starts where the first ended: it asks for no more
    with pytest.raises(OutOfResources):
        shared_memory.launch(kernel, (4,), "x", num_stages=3, BLOCK_M=128, num_warps=8)


def test_other_settings_are_fitted_on_their_own():
    kernel = Refusing(2)
    shared_memory.launch(kernel, (1,), num_stages=3, BLOCK_M=128)
    kernel.fits = 3
    shared_memory.launch(kernel, (1,), num_stages=3, BLOCK_M=64)  # another tile: its own count
    shared_memory.launch(kernel, (1,), num_stages=3, BLOCK_M=128)  # the kept count, not retried
    assert [launch[2] for launch in kernel.launches] == [2, 3, 2]


def test_a_launch_that_fits_nowhere_says_why():
    with pytest.raises(OutOfResources, match="shared memory"):
        shared_memory.launch(Refusing(0), (1,), num_stages=2, BLOCK_M=16)
