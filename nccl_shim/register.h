/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Buffer registration (register.c): ncclCommRegister's records on a communicator, and what
 * they tell the path that carries the buffer.
 */
#ifndef SHIM_REGISTER_H
#define SHIM_REGISTER_H

#include <nccl.h>
#include <stddef.h>

#include "comm.h"

/* Registers size bytes at buff (the caller checked the arguments); *handle_out is the record. */
ncclResult_t shim_reg_add(struct ncclComm *comm, void *buff, size_t size, void **handle_out);
/* Ends the registration handle of comm: ncclInvalidArgument (with a WARN) if it is not one. */
ncclResult_t shim_reg_remove(struct ncclComm *comm, void *handle);
/* Drops every record (destroy and abort; the device team lets its mappings go itself). */
void shim_reg_free_all(struct ncclComm *comm);

#endif
