/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the kernels know about NCCL's datatypes: size, the name nccl-tests prints, and whether
 * the type is a floating one (ncclAvg becomes PreMulSum for those, SumPostDiv for integers).
 * Called from api.c for argument checks and log lines, and by the kernels and tests.
 */
#include "kernels.h"

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} kr_types[ncclNumTypes] = {
    [ncclInt8] = {"int8", 1, false},           [ncclUint8] = {"uint8", 1, false},
    [ncclInt32] = {"int32", 4, false},         [ncclUint32] = {"uint32", 4, false},
    [ncclInt64] = {"int64", 8, false},         [ncclUint64] = {"uint64", 8, false},
    [ncclFloat16] = {"half", 2, true},         [ncclFloat32] = {"float", 4, true},
    [ncclFloat64] = {"double", 8, true},       [ncclBfloat16] = {"bfloat16", 2, true},
    [ncclFloat8e4m3] = {"f8e4m3", 1, true},    [ncclFloat8e5m2] = {"f8e5m2", 1, true},
};

static bool
kr_type_valid(ncclDataType_t type)
{
    /* The cast also catches negative values a caller may have forged into the enum. */
    return (unsigned)type < (unsigned)ncclNumTypes;
}

size_t
kr_type_size(ncclDataType_t type)
{
    return kr_type_valid(type) ? kr_types[type].size : 0;
}

const char *
kr_type_name(ncclDataType_t type)
{
    return kr_type_valid(type) ? kr_types[type].name : "?";
}

bool
kr_type_is_float(ncclDataType_t type)
{
    return kr_type_valid(type) && kr_types[type].is_float;
}
