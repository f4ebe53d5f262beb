-- Argo CD health check of orchard.dev/Sandbox (resource.customizations.health.orchard.dev_Sandbox).
-- Reads the kstatus conditions the operator writes (Stalled, Reconciling) and status.phase; see
-- docs/OPERATIONS.md for the table of states. Argo CD runs this with gopher-lua and only the base and
-- table libraries: no string.* calls here.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c)
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Sandbox is being deleted"
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

local phase = status.phase or ""
local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = "Failed: " .. (status.reason or "") .. " " .. (status.message or "")
  return hs
end
if phase == "Expired" then
  hs.status = "Degraded"
  hs.message = "Expired: " .. (status.message or "its TTL or heartbeat deadline passed")
  return hs
end
local reconciling = condition(status, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling)
  return hs
end
local ready = condition(status, "Ready")
if phase == "Ready" and ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = "Ready"
  return hs
end
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "Succeeded: the run finished"
  return hs
end
hs.status = "Progressing"
if phase == "" then
  hs.message = "Waiting for the operator"
else
  hs.message = "Phase " .. phase
end
return hs
