/* ListDevices: each card with its memory capacity and use. Needs no session. */
#include <stdio.h>

#include "methods/methods.h"
#include "ttd/v1/ttd.pb-c.h"

ttd_status_t ttd_method_list_devices(ttd_call *call, const ProtobufCMessage *request, ProtobufCMessage **out_response) {
  (void)request;
  ttd_backend *backend = call->core->backend;
  int count = backend->vtable->device_count(backend);
  Ttd__V1__ListDevicesResponse *resp = ttd_call_alloc(call, sizeof(*resp));
  Ttd__V1__DeviceInfo **devices = ttd_call_alloc(call, sizeof(*devices) * (size_t)count);
  TTD_CHECK_ALLOC(resp);
  TTD_CHECK_ALLOC(devices);
  ttd__v1__list_devices_response__init(resp);
  for (int d = 0; d < count; d++) {
    ttd_device_info info;
    backend->vtable->device_info(backend, d, &info);
    Ttd__V1__DeviceInfo *dev = ttd_call_alloc(call, sizeof(*dev));
    Ttd__V1__MemoryInfo *mem = ttd_call_alloc(call, sizeof(*mem) * TTD_MEM_COUNT);
    Ttd__V1__MemoryInfo **mems = ttd_call_alloc(call, sizeof(*mems) * TTD_MEM_COUNT);
    char *name = ttd_call_alloc(call, 16);
    TTD_CHECK_ALLOC(dev && mem && mems && name);
    ttd__v1__device_info__init(dev);
    snprintf(name, 16, "tt:%d", d);
    dev->name = name;
    dev->kind = ttd_call_strdup(call, info.kind);
    TTD_CHECK_ALLOC(dev->kind);
    dev->cores = info.cores;
    for (int m = 0; m < TTD_MEM_COUNT; m++) {
      ttd__v1__memory_info__init(&mem[m]);
      mem[m].location = (Ttd__V1__MemoryLocation)info.memory[m].location;
      mem[m].capacity_bytes = info.memory[m].capacity_bytes;
      mem[m].used_bytes = info.memory[m].used_bytes;
      mems[m] = &mem[m];
    }
    dev->n_memories = TTD_MEM_COUNT;
    dev->memories = mems;
    devices[d] = dev;
  }
  resp->n_devices = (size_t)count;
  resp->devices = devices;
  resp->instance_id = call->core->instance_id;
  *out_response = &resp->base;
  return TTD_OK;
}
