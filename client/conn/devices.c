/* tt_list_devices. */
#include <stdio.h>
#include <stdlib.h>

#include "conn/conn.h"

tt_status tt_list_devices(tt_client *client, tt_device_info **out_devices, size_t *out_count) {
  *out_devices = NULL;
  *out_count = 0;
  Ttd__V1__ListDevicesRequest req = TTD__V1__LIST_DEVICES_REQUEST__INIT;
  ProtobufCMessage *out = NULL;
  tt_status st = tt_rpc_unary(client, TT_RPC_LIST_DEVICES, &req.base, &ttd__v1__list_devices_response__descriptor, &out);
  if (st != TT_OK) return st;
  Ttd__V1__ListDevicesResponse *resp = (Ttd__V1__ListDevicesResponse *)out;
  tt_device_info *devices = calloc(resp->n_devices ? resp->n_devices : 1, sizeof(*devices));
  if (!devices) {
    protobuf_c_message_free_unpacked(out, NULL);
    return tt_client_fail(client, TT_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (size_t i = 0; i < resp->n_devices; i++) {
    const Ttd__V1__DeviceInfo *d = resp->devices[i];
    snprintf(devices[i].name, sizeof(devices[i].name), "%s", d->name);
    snprintf(devices[i].kind, sizeof(devices[i].kind), "%s", d->kind);
    devices[i].cores = d->cores;
    for (size_t m = 0; m < d->n_memories; m++) {
      tt_memory_info *info =
          d->memories[m]->location == TTD__V1__MEMORY_LOCATION__MEMORY_LOCATION_L1 ? &devices[i].l1 : &devices[i].dram;
      info->capacity_bytes = d->memories[m]->capacity_bytes;
      info->used_bytes = d->memories[m]->used_bytes;
    }
  }
  *out_devices = devices;
  *out_count = resp->n_devices;
  protobuf_c_message_free_unpacked(out, NULL);
  return TT_OK;
}

void tt_device_list_free(tt_device_info *devices) { free(devices); }
