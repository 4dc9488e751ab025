"""The ``vulkan`` memory domain: :class:`VulkanDomain <vkshmem.gpu.domain.vulkan.VulkanDomain>`
(``vulkan``), its symmetric segment (``segment``) and the CPU mappings of peers' heaps on other
GPUs (``peermap``). Its entry point is :mod:`vkshmem.gpu.plugin`; a vendor's accelerations
attach through :mod:`vkshmem.gpu.accel`."""
