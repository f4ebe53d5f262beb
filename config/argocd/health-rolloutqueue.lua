-- Argo CD health check of orchard.dev/RolloutQueue (resource.customizations.health.orchard.dev_RolloutQueue).
-- A queue is Healthy once the operator accounts for it (Active=True); the groups waiting in it are
-- reported on the RolloutGroups, not here. Argo CD runs this with gopher-lua and only the base and table
-- libraries: no string.* calls here.
local hs = {}
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "RolloutQueue is being deleted"
  return hs
end
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator"
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Active" and c.status == "True" then
      hs.status = "Healthy"
      hs.message = "Active: " .. tostring(status.runningTrajectories or 0) .. " trajectories running, " ..
        tostring(status.waitingGroups or 0) .. " groups waiting"
      return hs
    end
    if c.type == "Active" then
      hs.status = "Degraded"
      hs.message = (c.reason or "") .. ": " .. (c.message or "")
      return hs
    end
  end
end
hs.status = "Progressing"
hs.message = "Waiting for the operator"
return hs
