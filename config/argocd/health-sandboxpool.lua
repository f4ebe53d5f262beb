-- Argo CD health check of orchard.dev/SandboxPool (resource.customizations.health.orchard.dev_SandboxPool).
-- A pool is Healthy when every desired member is Ready, Degraded while its members fail (Stalled), and
-- Progressing while members start. Argo CD runs this with gopher-lua and only the base and table
-- libraries: no string.* calls here.
local hs = {}
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "SandboxPool is being deleted"
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
local desired = (obj.spec and obj.spec.replicas) or 0
local members = tostring(status.readyReplicas or 0) .. " of " .. tostring(desired) .. " members Ready"
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Stalled" and c.status == "True" then
      hs.status = "Degraded"
      hs.message = (c.reason or "") .. ": " .. (c.message or "")
      return hs
    end
  end
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" and c.status == "True" then
      hs.status = "Healthy"
      hs.message = members .. ", " .. tostring(status.claimedLastMinute or 0) .. " claimed in the last minute"
      return hs
    end
  end
  hs.status = "Progressing"
  hs.message = members .. ", " .. tostring(status.startingReplicas or 0) .. " starting"
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for the operator"
return hs
