/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernels' fatbin (reduce_device.cu, every architecture plus PTX), embedded as nvcc wrote
 * it, in the section the driver's tools look for (cuobjdump lists a library's kernels from
 * .nv_fatbin only). The Makefile assembles this with the fatbin's folder on the assembler's
 * include path; built without nvcc, the file is empty and device.c says so.
 */
    .section .nv_fatbin, "a"
    .balign 16
    .globl kr_fatbin_start
    .hidden kr_fatbin_start
kr_fatbin_start:
    .incbin "reduce_device.fatbin"
    .globl kr_fatbin_end
    .hidden kr_fatbin_end
kr_fatbin_end:
    .section .note.GNU-stack, "", @progbits
