/* SPDX-License-Identifier: Apache-2.0 */
/* ncclshim's own version, printed in the banner; the NCCL ABI version comes from nccl.h. */
#ifndef SHIM_VERSION_H
#define SHIM_VERSION_H

#include <nccl.h>

#define SHIM_VERSION_STRING "0.1.0"

#endif
