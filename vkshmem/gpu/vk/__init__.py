"""Vulkan objects: the binding (``_vk``), instances and physical devices (``instance``,
``physical``), the logical device and its queues (``logical``, ``device``: :class:`VulkanDevice
<vkshmem.gpu.vk.device.VulkanDevice>`), memory (``memory``, ``hostimport``), submissions and
copies (``submit``, ``batch``, ``copy``, ``native``: the C helper ``vkshmem.gpu._submit``),
compute pipelines and the shipped shaders as calls (``pipeline``, ``kernels``). Nothing here
knows of PEs, heaps or the runtime."""
