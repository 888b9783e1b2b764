from sarathi_lab.kv.block_pool import Block, BlockPool
from sarathi_lab.kv.manager import KVCacheManager, cdiv

__all__ = ["Block", "BlockPool", "KVCacheManager", "cdiv"]
