"""Hardware described as data: devices (and, later, topologies and numerics)."""

from perfcast.hardware.device import Device, device_names, get_device, load_device_file
from perfcast.hardware.spec import DeviceSpec, SpecError

__all__ = ["Device", "DeviceSpec", "SpecError", "device_names", "get_device", "load_device_file"]
